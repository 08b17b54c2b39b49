# Read by mha_add_backend (cmake/mha_helpers.cmake): oneTBB, and xsimd for the SIMD kernels the
# backend runs in parallel.
include(${PROJECT_SOURCE_DIR}/src/kernels/dependencies.cmake)
find_package(TBB QUIET)
if(TBB_FOUND AND MHA_SIMD_FOUND)
  set(found TRUE)
else()
  set(found FALSE)
endif()
set(package_dependencies "TBB")
