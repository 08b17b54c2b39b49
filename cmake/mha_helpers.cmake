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

# MHA_BACKEND_<NAME> = AUTO | ON | OFF.
function(mha_backend_option name description)
  set(MHA_BACKEND_${name} AUTO CACHE STRING "Build the ${description} backend: AUTO, ON or OFF")
  set_property(CACHE MHA_BACKEND_${name} PROPERTY STRINGS AUTO ON OFF)
  if(NOT MHA_BACKEND_${name} MATCHES "^(AUTO|ON|OFF)$")
    message(FATAL_ERROR "MHA_BACKEND_${name} is '${MHA_BACKEND_${name}}', expected AUTO, ON or OFF")
  endif()
endfunction()

# Sets MHA_WITH_<NAME> in the caller: built when its dependency is found and it is not OFF;
# ON without the dependency fails loudly.
function(mha_resolve_backend name found_var what)
  if(MHA_BACKEND_${name} STREQUAL "OFF")
    set(with OFF)
    set(status "off (MHA_BACKEND_${name}=OFF)")
  elseif(${found_var})
    set(with ON)
    set(status "on")
  elseif(MHA_BACKEND_${name} STREQUAL "ON")
    message(FATAL_ERROR "MHA_BACKEND_${name}=ON but ${what} was not found")
  else()
    set(with OFF)
    set(status "off (${what} not found)")
  endif()
  message(STATUS "mha: backend ${name}: ${status}")
  set(MHA_WITH_${name} ${with} PARENT_SCOPE)
endfunction()
