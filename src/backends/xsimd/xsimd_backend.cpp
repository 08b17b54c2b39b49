// The xsimd backend: the shared wrapper / split-weight drivers over the SIMD kernels (src/kernels)
// of one ISA, chosen at prepare() (MHA_XSIMD_ISA, else the best this CPU runs).
#include <algorithm>
#include <cstdlib>
#include <iterator>
#include <optional>

#include "base/text.hpp"
#include "common/attention_calls.hpp"
#include "driver/isa_plan.hpp"
#include "kernels/xsimd_kernel_set.hpp"
#include "mha/backends/xsimd.hpp"
#include "mha/error.hpp"

namespace mha {
namespace {

using detail::text;

class xsimd_impl final : public backend, public detail::attention_calls {
 public:
  // pinned: the ISA this instance always uses; nullopt follows xsimd_default_isa().
  explicit xsimd_impl(std::optional<mha::isa> pinned) : pinned_(pinned) {}

  std::string_view name() const noexcept override { return "xsimd"; }
  std::string description() const override { return detail::kernels_description(active_isa()); }
  mha::isa isa() const override { return active_isa(); }
  // What the kernel set computes: grouped K/V heads, decode and bf16 (every ISA alike).
  support supports(const problem& p) const override {
    return detail::driver_support<detail::xsimd_kernel_set<isa::sse2>>(p);
  }
  // mha::attention: the fused kernel of the plans' attention, fp32 or bf16.
  support supports_attention(precision) const override { return support::yes(); }

 private:
  mha::isa active_isa() const { return pinned_ ? *pinned_ : xsimd_default_isa(); }

  std::unique_ptr<plan> make_plan(const config& cfg, formulation form,
                                  const weights& w) const override {
    return detail::make_isa_plan<detail::xsimd_kernel_set>(active_isa(), cfg, form, w, name());
  }

  void attend(const detail::attention_args& args, const run_options&) const override {
    detail::attention(detail::kernels_for(active_isa()), args);
  }
  // An attention cache: a plan's, in the layout of the kernels of the ISA in use.
  std::int64_t attention_cache_head_bytes(std::int64_t capacity, std::int64_t head_dim,
                                          precision kv, precision compute) const noexcept override {
    return detail::cache_head_bytes(detail::kernels_for(active_isa()), capacity, head_dim,
                                    compute == precision::bf16, kv);
  }

  std::optional<mha::isa> pinned_;
};

}  // namespace

const backend& xsimd_backend() {
  static const xsimd_impl instance{std::nullopt};
  return instance;
}

std::vector<mha::isa> xsimd_supported_isas() { return detail::runnable_isas(); }

mha::isa xsimd_default_isa() { return detail::dispatched_isa(); }

const backend& xsimd_backend(mha::isa which) {
  // One instance per row of kernel_isas.def (kernels/arch/<arch>/).
  static const xsimd_impl pinned[] = {
#define MHA_KERNEL_ISA(name, ...) xsimd_impl{isa::name},
#include "kernel_isas.def"
#undef MHA_KERNEL_ISA
  };
  const auto found = std::find_if(std::begin(pinned), std::end(pinned),
                                  [&](const xsimd_impl& b) { return b.isa() == which; });
  if (found == std::end(pinned)) {
    throw invalid_argument(text("xsimd: no kernels for ", to_string(which),
                                detail::refusal_note(which), "; xsimd has ",
                                detail::isa_names(detail::built_isas())));
  }
  if (!detail::cpu_runs(which)) {
    throw invalid_argument(text("xsimd: this CPU does not support ", to_string(which),
                                detail::refusal_note(which), "; it supports ",
                                detail::isa_names(xsimd_supported_isas())));
  }
  return *found;
}

}  // namespace mha
