// mha::xsimd: hand-vectorised kernels (xsimd 8.1), one build per instruction set, the best one
// this CPU runs chosen at run time. Single-threaded; ignores run_options::threads.
#pragma once

#include <string_view>
#include <vector>

#include "mha/backend.hpp"
#include "mha/isa.hpp"

namespace mha {

// The xsimd backend has kernels for five instruction sets on x86-64 and one on aarch64
// (mha/isa.hpp), those of the architecture built all compiled into the library; which ones a CPU
// can run is a run-time question (xsimd_supported_isas()):
//   isa::amx         avx512bf16 plus AMX tiles: bf16 products on tiles
//   isa::avx512bf16  avx512 plus AVX512_BF16 and AVX512_VNNI: bf16 products in vdpbf16ps, an int8
//                    cache's in vpdpwssd (fp32 kernels as avx512)
//   isa::avx512      AVX-512 F/CD/DQ/BW/VL (x86-64-v4), 16 float lanes
//   isa::avx2        AVX2 + FMA (x86-64-v3), 8 lanes
//   isa::sse2        the x86-64 baseline, 4 lanes, no FMA
//   isa::neon64      aarch64's Advanced SIMD with FMA (its baseline), 4 lanes

// The ISAs this CPU can run, best first: the CPU (and OS) supports the whole x86-64 level the
// ISA's kernels are compiled for and the extensions beside it (the architecture's rows:
// src/kernels/arch/<arch>/kernel_isas.def). Never empty.
std::vector<isa> xsimd_supported_isas();

// The ISA xsimd_backend() computes with: the one MHA_XSIMD_ISA names when that variable is set
// and not empty, else the best this CPU runs. Read at every call, so a change of the variable
// applies to the next prepare(). Throws mha::invalid_argument naming the value when
// MHA_XSIMD_ISA is not one of the build's ISAs (amx|avx512bf16|avx512|avx2|sse2 on x86-64, neon64
// on aarch64) or names an ISA this CPU lacks.
isa xsimd_default_isa();

// The xsimd backend (link mha::xsimd), as registered under the name "xsimd". Its ISA is
// xsimd_default_isa(), resolved when a plan is prepared (the plan keeps it) and by
// description() ("xsimd 8.1.0, avx512bw, 16 lanes"); both throw what xsimd_default_isa() throws.
const backend& xsimd_backend();

// The xsimd backend pinned to one ISA, ignoring MHA_XSIMD_ISA: for testing and comparing the
// kernels of each ISA on one machine. Its name() is "xsimd" too. Throws mha::invalid_argument
// when `which` is not one of the build's ISAs above or this CPU cannot run it (listing the ones it
// can).
const backend& xsimd_backend(isa which);

}  // namespace mha
