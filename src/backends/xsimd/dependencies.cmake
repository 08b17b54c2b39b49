# Read by mha_add_backend (cmake/mha_helpers.cmake): sets `found`; nothing for consumers to find
# (xsimd is header-only and used inside the library).
include(${PROJECT_SOURCE_DIR}/src/kernels/dependencies.cmake)
set(found ${MHA_SIMD_FOUND})
set(package_dependencies "")
