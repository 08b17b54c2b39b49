# The SIMD kernels' one dependency, header-only xsimd (libxsimd-dev): sets MHA_SIMD_FOUND.
# Included by the dependencies.cmake of every backend built on the kernels.
find_package(xsimd QUIET)
if(xsimd_FOUND AND NOT TARGET xtl)
  # Debian's xsimd 8.1 config links a phantom `xtl` target; xsimd itself is header-only.
  add_library(xtl INTERFACE IMPORTED)
endif()
set(MHA_SIMD_FOUND ${xsimd_FOUND})
