// mha_bench: the machine and build description in the JSON "context" (keys mha_*, listed in
// bench/README.md), so a result file says where and how it was measured.
#pragma once

#include <span>
#include <string>

#include "fma_peak.hpp"
#include "mha/backend.hpp"
#include "stream_read.hpp"

namespace mha_bench {

// The CPU's model name ("unknown" when not found): /proc/cpuinfo's model name on x86-64, the
// core named from its MIDR on aarch64 (machine_cpu_<arch>.cpp), "(emulated on <host>)" added
// where an emulator runs the code.
std::string cpu_model();

// CPU model and ISA extensions, hardware threads, compiler, flags, build type, library
// versions, mha version: benchmark::AddCustomContext, once before the benchmarks run.
void add_machine_context();

// The measured FMA peak (one core, all cores, every one-core trial; per ISA), in GFLOP/s.
void add_peak_context(const fma_peak& peak);

// The measured streaming-read bandwidth (one core, all cores, every one-core pass), in GB/s.
void add_bandwidth_context(const stream_read& bandwidth);

// What each backend dispatched to and which peak its figures are read against
// (mha_backend_<name>_isa, mha_backend_<name>_peak_isa), the ISA family the SIMD backends ran
// under (mha_dispatch: an ISA as mha::to_string names it, "mixed (...)", or "scalar" with none)
// and the environment variables that capped it (mha_isa_overrides).
void add_dispatch_context(std::span<const mha::backend* const> backends);

// "MHA_XSIMD_ISA=avx2 ONEDNN_MAX_CPU_ISA=AVX2": the ISA caps set in the environment, "" if none.
std::string isa_overrides();

}  // namespace mha_bench
