# Checks the ODR hazard of mha_kernels' per-ISA objects (kernels_avx512/avx2/sse2.cpp.o, each
# compiled with its own -march). A weak or unique symbol is kept once by the linker for every
# caller in the program; if an ISA object defines one that code built for another ISA also
# uses (an inline helper, a std template, an xsimd template of a narrower arch), the program
# may run AVX-512 code on a CPU without it. Allowed are only symbols that no other build can
# define: those in the object's own namespace mha::detail::<isa>, and xsimd templates
# instantiated for the object's own arch and no other.
#   cmake -DNM=<nm> -DOBJECTS=<a;b;...> -P check_isa_symbols.cmake
set(arch_amx "xsimd::avx512bw")  # the AVX-512 arch, built with AVX512_BF16 and AMX on top
set(arch_avx512bf16 "xsimd::avx512bw")  # the AVX-512 arch, built with AVX512_BF16 on top
set(arch_avx512 "xsimd::avx512bw")
set(arch_avx2 "xsimd::avx2")  # also matches fma3<xsimd::avx2>
set(arch_sse2 "xsimd::sse2")
set(isas amx avx512bf16 avx512 avx2 sse2)

set(checked 0)
foreach(object IN LISTS OBJECTS)
  if(NOT object MATCHES "kernels_(amx|avx512bf16|avx512|avx2|sse2)\\.cpp\\.o$")
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
    math(EXPR checked "${checked} + 1")
    # The C++ runtime's personality reference is the same in every object.
    if(name STREQUAL "DW.ref.__gxx_personality_v0")
      continue()
    endif()
    string(FIND "${name}" "mha::detail::${isa}::" own_namespace)
    if(NOT own_namespace EQUAL -1)
      continue()
    endif()
    set(own_arch_only FALSE)
    string(FIND "${name}" "${arch_${isa}}" own_arch)
    if(name MATCHES "^xsimd::" AND NOT own_arch EQUAL -1)
      set(own_arch_only TRUE)
      foreach(other IN LISTS isas)
        string(FIND "${name}" "${arch_${other}}" other_arch)
        # The amx, avx512bf16 and avx512 objects share the arch: an xsimd template of it may
        # come from any, and all need x86-64-v4 (xsimd emits no bf16 or tile instruction itself).
        if(NOT other STREQUAL isa AND NOT arch_${other} STREQUAL arch_${isa} AND
           NOT other_arch EQUAL -1)
          set(own_arch_only FALSE)
        endif()
      endforeach()
    endif()
    if(NOT own_arch_only)
      message(FATAL_ERROR "${object}: shareable symbol outside mha::detail::${isa} that "
                          "another build could define too: ${name}")
    endif()
  endforeach()
endforeach()
if(checked EQUAL 0)
  message(FATAL_ERROR "no per-ISA symbols checked in: ${OBJECTS}")
endif()
message(STATUS "${checked} shareable symbols in the per-ISA objects, none shared across ISAs")
