# Read by mha_add_backend (cmake/mha_helpers.cmake): Debian's oneDNN runs on OpenMP, and the
# backend sets its thread count through omp_*.
find_package(dnnl QUIET)
find_package(OpenMP QUIET COMPONENTS CXX)
if(dnnl_FOUND AND OpenMP_CXX_FOUND)
  set(found TRUE)
else()
  set(found FALSE)
endif()
set(package_dependencies "dnnl" "OpenMP COMPONENTS CXX")
