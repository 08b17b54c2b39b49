// Internal to mha_fma_peak: the one FMA loop of the bench's own, for the scalar and portable
// kernels on any machine (the SIMD ISAs' loops are the kernels' own: isa_kernels::fma_rounds).
#pragma once

#include <cstdint>

namespace mha_bench::detail {

// `rounds` rounds of 12 independent chains acc = acc * a + b on 4-lane vectors, compiled for the
// architecture's baseline (a multiply and an add on x86-64's, which has no FMA), a value
// derived from the accumulators in *sink (so the loop cannot be removed); the FLOPs done (2 per
// lane per chain and round).
double fma_rounds_portable(std::int64_t rounds, float* sink) noexcept;

}  // namespace mha_bench::detail
