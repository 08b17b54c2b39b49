// mha::xsimd: hand-vectorised kernels (xsimd 8.1), one build per instruction set, the best one
// this CPU runs chosen at run time. Single-threaded; ignores run_options::threads.
#pragma once

#include <string_view>
#include <vector>

#include "mha/backend.hpp"

namespace mha {

// The instruction sets the xsimd backend has kernels for, best first. All of them are compiled
// into the library; which ones a CPU can run is a run-time question (xsimd_supported_isas()).
enum class xsimd_isa {
  avx512bf16,  // avx512 plus AVX512_BF16: bf16 products in vdpbf16ps (fp32 kernels as avx512)
  avx512,      // AVX-512 F/CD/DQ/BW/VL (x86-64-v4), 16 float lanes
  avx2,        // AVX2 + FMA (x86-64-v3), 8 lanes
  sse2,        // the x86-64 baseline, 4 lanes, no FMA
};

// "avx512bf16", "avx512", "avx2" or "sse2": the names the environment variable MHA_XSIMD_ISA
// accepts.
std::string_view to_string(xsimd_isa isa) noexcept;

// The ISAs this CPU can run, best first: the CPU (and OS) supports the whole x86-64 level the
// ISA's kernels are compiled for (x86-64-v4 plus AVX512_BF16, x86-64-v4, -v3, baseline). Never
// empty on x86-64.
std::vector<xsimd_isa> xsimd_supported_isas();

// The ISA xsimd_backend() computes with: the one MHA_XSIMD_ISA names when that variable is set
// and not empty, else the best this CPU runs (xsimd::dispatch). Read at every call, so a change
// of the variable applies to the next prepare(). Throws mha::invalid_argument naming the value
// when MHA_XSIMD_ISA is not one of avx512bf16|avx512|avx2|sse2 or names an ISA this CPU lacks.
xsimd_isa xsimd_default_isa();

// The xsimd backend (link mha::xsimd), as registered under the name "xsimd". Its ISA is
// xsimd_default_isa(), resolved when a plan is prepared (the plan keeps it) and by
// description() ("xsimd 8.1.0, avx512bw, 16 lanes"); both throw what xsimd_default_isa() throws.
const backend& xsimd_backend();

// The xsimd backend pinned to one ISA, ignoring MHA_XSIMD_ISA: for testing and comparing the
// kernels of each ISA on one machine. Its name() is "xsimd" too. Throws mha::invalid_argument
// when this CPU cannot run `isa` (listing the ones it can).
const backend& xsimd_backend(xsimd_isa isa);

}  // namespace mha
