# Checks the ODR hazard of mha_kernels' per-ISA objects (kernels_<isa>.cpp.o, each compiled
# with its own flags). A weak or unique symbol is kept once by the linker for every caller in
# the program; if an ISA object defines one that code built for another ISA also uses (an inline
# helper, a std template, an xsimd template of a narrower arch), the program may run AVX-512
# code on a CPU without it. Allowed are only symbols that no other build can define: those in
# the object's own namespace mha::detail::<isa>, and xsimd templates instantiated for the
# object's own arch and no other. The ISAs and their archs are the rows of
# src/kernels/arch/<arch>/kernel_isas.def.
#   cmake -DNM=<nm> -DOBJECTS=<a;b;...> -DISA_TABLE=<kernel_isas.def> -P check_isa_symbols.cmake
file(STRINGS ${ISA_TABLE} rows REGEX "^MHA_KERNEL_ISA\\(")
set(isas "")
foreach(row IN LISTS rows)
  if(NOT row MATCHES "^MHA_KERNEL_ISA\\(([a-z0-9_]+), ([^,]+),")
    message(FATAL_ERROR "${ISA_TABLE}: unreadable row ${row}")
  endif()
  set(isa ${CMAKE_MATCH_1})
  # The innermost arch names the templates: fma3<xsimd::avx2> is xsimd::avx2's.
  string(REGEX MATCHALL "xsimd::[a-z0-9_]+" archs "${CMAKE_MATCH_2}")
  list(GET archs -1 arch_${isa})
  list(APPEND isas ${isa})
endforeach()
list(JOIN isas "|" isa_alternatives)

set(checked 0)
foreach(object IN LISTS OBJECTS)
  if(NOT object MATCHES "kernels_(${isa_alternatives})\\.cpp\\.o$")
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
    # xsimd's NEON reinterpretation wrappers (xsimd::kernel::wrap::vreinterpretq_f32_s32, ...):
    # plain inline functions that reinterpret a register and emit no instruction but the return,
    # so every build on NEON makes them the same.
    if(name MATCHES "^xsimd::kernel::wrap::vreinterpretq_[a-z0-9_]+\\(")
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
        # Objects that share an arch (amx, avx512bf16 and avx512: xsimd::avx512bw) may each
        # define its templates, and all need its x86-64 level (xsimd emits no bf16, VNNI or tile
        # instruction itself).
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
