// Internal: the per-ISA kernel tables, one accessor per row of kernels/kernel_isas.def, each
// defined in the translation unit compiled for its ISA (micro/kernels_<name>.cpp).
#pragma once

#include "kernels/isa_kernels.hpp"

namespace mha::detail {

#define MHA_KERNEL_ISA(name, ...) const isa_kernels* name##_kernels() noexcept;
#include "kernels/kernel_isas.def"
#undef MHA_KERNEL_ISA

}  // namespace mha::detail
