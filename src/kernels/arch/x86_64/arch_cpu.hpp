// Internal: what the rows of kernel_isas.def ask of this x86-64 CPU, for dispatch.cpp's table
// (included just before it). cpu_has names a feature as GCC's __builtin_cpu_supports does
// ("x86-64-v4", "avx512bf16", ...); amx_refusal (kernels/interface/isa_kernels.hpp) is in
// arch_cpu.cpp.
#pragma once

#define cpu_has(feature) __builtin_cpu_supports(feature)
