# Read by mha_add_backend (cmake/mha_helpers.cmake, which sets `found` FALSE first): oneTBB, and
# xsimd for the SIMD kernels the backend runs in parallel; OpenMP, when the compiler has it, for
# its OpenMP executor (mha::openmp_executor; without it the accessor returns nullptr).
include(${PROJECT_SOURCE_DIR}/src/kernels/dependencies.cmake)
find_package(TBB QUIET)
if(TBB_FOUND AND MHA_SIMD_FOUND)
  set(found TRUE)
endif()
set(package_dependencies "TBB")
find_package(OpenMP QUIET COMPONENTS CXX)
if(OpenMP_CXX_FOUND)
  list(APPEND package_dependencies "OpenMP COMPONENTS CXX")
endif()
