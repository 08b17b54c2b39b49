// mha_bench: the machine and build description in the JSON "context" (keys mha_*, listed in
// bench/README.md), so a result file says where and how it was measured.
#pragma once

#include "fma_peak.hpp"

namespace mha_bench {

// CPU model and ISA extensions, hardware threads, compiler, flags, build type, library
// versions, mha version: benchmark::AddCustomContext, once before the benchmarks run.
void add_machine_context();

// The measured FMA peak (one core, all cores, per ISA), in GFLOP/s.
void add_peak_context(const fma_peak& peak);

}  // namespace mha_bench
