// Internal to mha_fma_peak: one FMA throughput loop per instruction set, each compiled in its
// own translation unit with its own -march (bench/CMakeLists.txt).
#pragma once

#include <cstdint>

namespace mha_bench::detail {

// Each runs `rounds` rounds of 12 (neon: 24) independent chains acc = acc * a + b on full-width
// vectors, stores a value derived from the accumulators in *sink (so the loop cannot be removed)
// and returns the FLOPs done (2 per lane per FMA). Call a kernel only on a CPU that has its ISA.
double fma_rounds_avx512(std::int64_t rounds, float* sink) noexcept;    // x86-64-v4
double fma_rounds_avx2(std::int64_t rounds, float* sink) noexcept;      // x86-64-v3
double fma_rounds_portable(std::int64_t rounds, float* sink) noexcept;  // no -march flag
double fma_rounds_neon(std::int64_t rounds, float* sink) noexcept;      // aarch64: 24 chains
// The same with bf16 dot products (vdpbf16ps: 64 FLOPs per 16-lane instruction).
double bf16_dot_rounds_avx512bf16(std::int64_t rounds, float* sink) noexcept;  // +AVX512_BF16
double bf16_tile_rounds_amx(std::int64_t rounds, float* sink) noexcept;        // +AMX-BF16, granted

}  // namespace mha_bench::detail
