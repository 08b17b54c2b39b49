# The SIMD kernels' one dependency, header-only xsimd (libxsimd-dev), and an architecture they
# have ISAs for: sets MHA_SIMD_FOUND and MHA_KERNEL_ARCH (the folder src/kernels/arch/<arch>/: its
# ISA rows kernel_isas.def, its CPU probe and its vector primitives). Included by the
# dependencies.cmake of every backend built on the kernels.
find_package(xsimd QUIET)
if(xsimd_FOUND AND NOT TARGET xtl)
  # Debian's xsimd 8.1 config links a phantom `xtl` target; xsimd itself is header-only.
  add_library(xtl INTERFACE IMPORTED)
endif()
if(CMAKE_SYSTEM_PROCESSOR MATCHES "^(x86_64|AMD64|amd64)$")
  set(MHA_KERNEL_ARCH x86_64)
elseif(CMAKE_SYSTEM_PROCESSOR MATCHES "^(aarch64|arm64|ARM64)$")
  set(MHA_KERNEL_ARCH aarch64)
else()
  set(MHA_KERNEL_ARCH "")
endif()
if(xsimd_FOUND AND NOT MHA_KERNEL_ARCH)
  message(STATUS "mha: the SIMD kernels have no ISAs for ${CMAKE_SYSTEM_PROCESSOR} "
                 "(src/kernels/arch/ has x86_64 and aarch64)")
endif()
if(xsimd_FOUND AND MHA_KERNEL_ARCH)
  set(MHA_SIMD_FOUND TRUE)
else()
  set(MHA_SIMD_FOUND FALSE)
endif()
