// Internal: the per-ISA kernel tables, one accessor per row of kernel_isas.def (the
// architecture's: kernels/arch/<arch>/), each defined in the translation unit compiled for its
// ISA (micro/kernels_<name>.cpp), and what the architecture's arch_cpu.cpp adds to the dispatch.
#pragma once

#include "kernels/interface/isa_kernels.hpp"

namespace mha::detail {

#define MHA_KERNEL_ISA(name, ...) const isa_kernels* name##_kernels() noexcept;
#include "kernel_isas.def"
#undef MHA_KERNEL_ISA

// What kernels_description adds for `which` on this CPU (", bf16 products on AMX tiles"; a CPU
// feature the kernels leave unused), "" when nothing: kernels/arch/<arch>/arch_cpu.cpp.
std::string description_note(mha::isa which);

}  // namespace mha::detail
