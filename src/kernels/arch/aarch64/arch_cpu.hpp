// Internal: what the rows of kernel_isas.def ask of this aarch64 CPU, for dispatch.cpp's table
// (included just before it): nothing, as the one row (neon64) is the architecture's baseline.
// A row for an optional extension (SVE, BF16) would read the kernel's HWCAP words here
// (getauxval(AT_HWCAP), AT_HWCAP2), as arch_cpu.cpp does for the kernels' description.
#pragma once
