// mha::xsimd: hand-vectorised kernels (xsimd 8.1), one build per instruction set, the best one
// this CPU runs chosen at run time. Single-threaded; ignores run_options::threads.
#pragma once

#include <string_view>
#include <vector>

#include "mha/backend.hpp"
#include "mha/isa.hpp"

namespace mha {

// The xsimd backend has kernels for every x86-64 ISA of mha/isas.def from the baseline (sse2)
// up, and for aarch64's (neon64): those of the architecture built, all compiled into the library
// (their build rows: src/kernels/arch/<arch>/kernel_isas.def). Which ones a CPU can run is a
// run-time question (xsimd_supported_isas()).

// The ISAs this CPU can run, best first: the CPU (and OS) supports the whole x86-64 level the
// ISA's kernels are compiled for and the extensions beside it (the architecture's rows:
// src/kernels/arch/<arch>/kernel_isas.def). Never empty.
std::vector<isa> xsimd_supported_isas();

// The ISA xsimd_backend() computes with: the one MHA_XSIMD_ISA names when that variable is set
// and not empty, else the best this CPU runs. Read at every call, so a change of the variable
// applies to the next prepare(). Throws mha::invalid_argument naming the value when
// MHA_XSIMD_ISA is not one of the build's ISAs (the message lists them) or names an ISA this CPU
// lacks.
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
