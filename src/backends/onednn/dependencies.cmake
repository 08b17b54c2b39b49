# Read by mha_add_backend (cmake/mha_helpers.cmake, which sets `found` FALSE first): Debian's
# oneDNN runs on OpenMP, and the backend sets its thread count through omp_*.
find_package(dnnl QUIET)
find_package(OpenMP QUIET COMPONENTS CXX)
if(dnnl_FOUND AND OpenMP_CXX_FOUND)
  set(found TRUE)
endif()
set(package_dependencies "dnnl" "OpenMP COMPONENTS CXX")
