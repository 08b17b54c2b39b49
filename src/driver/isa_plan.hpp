// Internal: a driver plan over the kernel set of the ISA chosen at run time, for the backends
// whose kernel sets are a template over the ISA (xsimd, tbb: kernels/xsimd_kernel_set.hpp).
#pragma once

#include <memory>
#include <string_view>

#include "base/text.hpp"
#include "driver/driver.hpp"
#include "mha/error.hpp"
#include "mha/isa.hpp"

namespace mha::detail {

// A driver plan over Set<isa>, the kernel-set template instantiated for the ISA chosen at run
// time (Set<Isa> must be a kernel set for each row of kernel_isas.def (kernels/arch/<arch>/);
// `which` is one of them, runnable_isas() being what callers pass).
template <template <mha::isa> class Set>
std::unique_ptr<plan> make_isa_plan(mha::isa which, const config& cfg, formulation form,
                                    const weights& w, std::string_view backend_name) {
  switch (which) {
#define MHA_KERNEL_ISA(name, ...) \
  case isa::name:                 \
    return std::make_unique<driver_plan<Set<isa::name>>>(cfg, form, w, backend_name);
#include "kernel_isas.def"
#undef MHA_KERNEL_ISA
    default:
      break;
  }
  throw invalid_argument(text(backend_name, ": no kernels for ", to_string(which)));
}

}  // namespace mha::detail
