# Helpers shared by the project's CMakeLists.

# Warnings as errors on project code only (dependencies are system headers).
function(mha_warnings target)
  target_compile_options(${target} PRIVATE -Wall -Wextra -Wpedantic -Wshadow -Werror)
endfunction()

# A library of the installed package: warnings, alias mha::<export_name>, exported.
function(mha_library target export_name)
  mha_warnings(${target})
  set_target_properties(${target} PROPERTIES EXPORT_NAME ${export_name})
  add_library(mha::${export_name} ALIAS ${target})
  install(TARGETS ${target} EXPORT mhaTargets
          ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
          LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
          RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
endfunction()

# ---- backends ----
# mha_add_backend(<name> DESCRIPTION <text> [REQUIRES <what to install>]
#                 [TESTS <sources in tests/>] [TEST_LIBRARIES <targets>])
# The one place a backend is registered (docs/design.md, "Adding a backend"). Called in rank
# order, best first: that order is mha::available_backends()'s. The backend's folder
# src/backends/<name>/ holds its CMakeLists.txt (the library mha_<name>, exported as
# mha::<name>) and, when it has dependencies, a dependencies.cmake that finds them and sets
# `found` (TRUE/FALSE) and `package_dependencies` (the find_dependency() arguments an installed
# consumer needs, one list item each). include/mha/backends/<name>.hpp declares
# `const backend& <name>_backend();`.
# A backend with dependencies gets the cache option MHA_BACKEND_<NAME> = AUTO (built when they
# are found) | ON (required: fails without them) | OFF; one without is always built. Sets
# MHA_WITH_<NAME> (ON/OFF); a built backend's folder is added, its name appended to
# MHA_BACKENDS (built, best first) and its TESTS (with TEST_LIBRARIES) join the unit suite.
# A macro, so the packages its dependencies.cmake finds (and their <package>_VERSION) stay
# visible to the rest of the build.
macro(mha_add_backend name)
  cmake_parse_arguments(_mha "" "DESCRIPTION;REQUIRES" "TESTS;TEST_LIBRARIES" ${ARGN})
  string(TOUPPER ${name} _mha_upper)
  set(_mha_folder ${PROJECT_SOURCE_DIR}/src/backends/${name})
  set(package_dependencies "")
  if(EXISTS ${_mha_folder}/dependencies.cmake)
    set(MHA_BACKEND_${_mha_upper} AUTO CACHE STRING
        "Build the ${_mha_DESCRIPTION} backend: AUTO, ON or OFF")
    set_property(CACHE MHA_BACKEND_${_mha_upper} PROPERTY STRINGS AUTO ON OFF)
    if(NOT MHA_BACKEND_${_mha_upper} MATCHES "^(AUTO|ON|OFF)$")
      message(FATAL_ERROR "MHA_BACKEND_${_mha_upper} is '${MHA_BACKEND_${_mha_upper}}', "
                          "expected AUTO, ON or OFF")
    endif()
    set(found FALSE)
    if(NOT MHA_BACKEND_${_mha_upper} STREQUAL "OFF")
      include(${_mha_folder}/dependencies.cmake)
    endif()
    if(MHA_BACKEND_${_mha_upper} STREQUAL "OFF")
      set(MHA_WITH_${_mha_upper} OFF)
      set(_mha_status "off (MHA_BACKEND_${_mha_upper}=OFF)")
    elseif(found)
      set(MHA_WITH_${_mha_upper} ON)
      set(_mha_status "on")
    elseif(MHA_BACKEND_${_mha_upper} STREQUAL "ON")
      message(FATAL_ERROR "MHA_BACKEND_${_mha_upper}=ON but ${_mha_REQUIRES} was not found")
    else()
      set(MHA_WITH_${_mha_upper} OFF)
      set(_mha_status "off (${_mha_REQUIRES} not found)")
    endif()
  else()
    set(MHA_WITH_${_mha_upper} ON)
    set(_mha_status "on (no dependencies)")
  endif()
  message(STATUS "mha: backend ${name}: ${_mha_status}")
  set_property(GLOBAL APPEND PROPERTY MHA_DECLARED_BACKENDS ${name})
  if(MHA_WITH_${_mha_upper})
    add_subdirectory(${_mha_folder})
    list(APPEND MHA_BACKENDS ${name})
    set_property(GLOBAL PROPERTY MHA_BACKEND_${name}_TESTS ${_mha_TESTS})
    set_property(GLOBAL PROPERTY MHA_BACKEND_${name}_TEST_LIBRARIES ${_mha_TEST_LIBRARIES})
    set_property(GLOBAL PROPERTY MHA_BACKEND_${name}_PACKAGES "${package_dependencies}")
  endif()
endmacro()

# The SIMD kernels (src/kernels) for a backend built on them, added once whichever asks first.
function(mha_add_kernels)
  if(NOT TARGET mha_kernels)
    add_subdirectory(${PROJECT_SOURCE_DIR}/src/kernels ${PROJECT_BINARY_DIR}/src/kernels)
  endif()
endfunction()

# After the last mha_add_backend: writes what the code and the installed package derive from
# the backends built (MHA_BACKENDS, best first):
#   include/mha/build_config.hpp   MHA_WITH_<NAME> 0/1 per declared backend, MHA_BACKEND_NAMES
#   include/mha/backends/all.hpp   the built backends' headers (for mha/mha.hpp)
#   src/core/backend_list.hpp      the registry's list, best first (src/core/registry.cpp)
# and sets MHA_CONFIG_BACKENDS, the backends' block of mhaConfig.cmake.
function(mha_write_backend_list)
  get_property(declared GLOBAL PROPERTY MHA_DECLARED_BACKENDS)
  set(with_defines "")
  set(config "")
  foreach(name IN LISTS declared)
    string(TOUPPER ${name} upper)
    if(MHA_WITH_${upper})
      set(on 1)
    else()
      set(on 0)
    endif()
    string(APPEND with_defines "#define MHA_WITH_${upper} ${on}\n")
    string(APPEND config "set(MHA_WITH_${upper} ${on})\n")
  endforeach()
  set(headers "")
  set(accessors "")
  foreach(name IN LISTS MHA_BACKENDS)
    string(APPEND headers "#include \"mha/backends/${name}.hpp\"\n")
    string(APPEND accessors " \\\n    &::mha::${name}_backend(),")
    get_property(packages GLOBAL PROPERTY MHA_BACKEND_${name}_PACKAGES)
    foreach(package IN LISTS packages)
      string(APPEND config "find_dependency(${package})\n")
    endforeach()
  endforeach()
  string(REPLACE ";" "," names "${MHA_BACKENDS}")
  set(generated "// Generated by CMake (mha_write_backend_list, cmake/mha_helpers.cmake): do not edit.\n")
  file(CONFIGURE OUTPUT ${PROJECT_BINARY_DIR}/include/mha/build_config.hpp CONTENT
"${generated}// Which backends this build of the library contains.
#pragma once

#define MHA_VERSION \"${PROJECT_VERSION}\"
${with_defines}// The built backends, best first: the names of mha::available_backends().
#define MHA_BACKEND_NAMES \"${names}\"
")
  file(CONFIGURE OUTPUT ${PROJECT_BINARY_DIR}/include/mha/backends/all.hpp CONTENT
"${generated}// The headers of the backends this build contains.
#pragma once

${headers}")
  file(CONFIGURE OUTPUT ${PROJECT_BINARY_DIR}/src/core/backend_list.hpp CONTENT
"${generated}// The registry's backends, best first (the order of the mha_add_backend calls).
#pragma once

#include \"mha/backends/all.hpp\"

#define MHA_BACKEND_LIST${accessors}
")
  set(MHA_CONFIG_BACKENDS "${config}" PARENT_SCOPE)
endfunction()
