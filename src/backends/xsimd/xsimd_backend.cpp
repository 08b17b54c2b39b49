// The xsimd backend: the shared wrapper / split-weight drivers over the SIMD kernels (src/kernels)
// of one ISA, chosen at prepare() (MHA_XSIMD_ISA, else the best this CPU runs).
#include <cstdlib>
#include <optional>

#include "core/text.hpp"
#include "kernels/kernel_set.hpp"
#include "mha/backends/xsimd.hpp"
#include "mha/error.hpp"

namespace mha {
namespace {

using detail::text;

class xsimd_impl final : public backend {
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

 private:
  mha::isa active_isa() const { return pinned_ ? *pinned_ : xsimd_default_isa(); }

  std::unique_ptr<plan> make_plan(const config& cfg, formulation form,
                                  const weights& w) const override {
    return detail::make_isa_plan<detail::xsimd_kernel_set>(active_isa(), cfg, form, w, name());
  }

  std::optional<mha::isa> pinned_;
};

}  // namespace

const backend& xsimd_backend() {
  static const xsimd_impl instance{std::nullopt};
  return instance;
}

const backend& xsimd_backend(mha::isa which) {
  static const xsimd_impl amx{isa::amx}, avx512bf16{isa::avx512bf16}, avx512{isa::avx512},
      avx2{isa::avx2}, sse2{isa::sse2};
  const xsimd_impl* pinned = which == isa::amx          ? &amx
                             : which == isa::avx512bf16 ? &avx512bf16
                             : which == isa::avx512     ? &avx512
                             : which == isa::avx2       ? &avx2
                             : which == isa::sse2       ? &sse2
                                                        : nullptr;
  if (pinned == nullptr) {
    throw invalid_argument(text("xsimd: no kernels for ", to_string(which),
                                "; xsimd has amx, avx512bf16, avx512, avx2 and sse2"));
  }
  if (!detail::cpu_runs(which)) {
    throw invalid_argument(text("xsimd: this CPU does not support ", to_string(which),
                                detail::refusal_note(which), "; it supports ",
                                detail::isa_names(xsimd_supported_isas())));
  }
  return *pinned;
}

}  // namespace mha
