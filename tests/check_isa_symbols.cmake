# Checks that each per-ISA object of mha_xsimd defines its shareable (weak / unique) symbols only
# inside its own namespace mha::detail::<isa>. A shareable symbol outside it (an inline helper,
# a std or xsimd template instantiated out of line) could be emitted by two ISA builds under one
# name; the linker keeps one copy for all callers and may run AVX-512 code on a CPU without it.
#   cmake -DNM=<nm> -DOBJECTS=<a;b;...> -P check_isa_symbols.cmake
set(checked 0)
foreach(object IN LISTS OBJECTS)
  if(NOT object MATCHES "kernels_(avx512|avx2|sse2)\\.cpp\\.o$")
    continue()
  endif()
  set(isa ${CMAKE_MATCH_1})
  execute_process(COMMAND ${NM} -C --defined-only ${object}
                  OUTPUT_VARIABLE symbols RESULT_VARIABLE status)
  if(NOT status EQUAL 0)
    message(FATAL_ERROR "${NM} failed on ${object}")
  endif()
  string(REPLACE "\n" ";" lines "${symbols}")
  foreach(line IN LISTS lines)
    # nm: address, type, name. W/V/w/v weak, u unique (template statics).
    if(NOT line MATCHES "^[0-9a-f]+ [WVwvu] (.*)$")
      continue()
    endif()
    set(name "${CMAKE_MATCH_1}")
    # The C++ runtime's personality reference is the same in every object.
    if(name STREQUAL "DW.ref.__gxx_personality_v0")
      continue()
    endif()
    string(FIND "${name}" "mha::detail::${isa}::" inside)
    if(inside EQUAL -1)
      message(FATAL_ERROR "${object}: shareable symbol outside mha::detail::${isa}: ${name}")
    endif()
    math(EXPR checked "${checked} + 1")
  endforeach()
endforeach()
if(checked EQUAL 0)
  message(FATAL_ERROR "no per-ISA symbols checked in: ${OBJECTS}")
endif()
message(STATUS "${checked} per-ISA symbols, all in their ISA's namespace")
