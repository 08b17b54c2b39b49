// The xsimd backend: the shared wrapper / split-weight drivers over the SIMD kernels (src/simd)
// of one ISA, chosen at prepare() (MHA_XSIMD_ISA, else the best this CPU runs).
#include <cstdlib>
#include <optional>

#include "core/text.hpp"
#include "mha/backends/xsimd.hpp"
#include "mha/error.hpp"
#include "simd/kernel_set.hpp"

namespace mha {
namespace {

using detail::text;

class xsimd_impl final : public backend {
 public:
  // pinned: the ISA this instance always uses; nullopt follows xsimd_default_isa().
  explicit xsimd_impl(std::optional<xsimd_isa> pinned) : pinned_(pinned) {}

  std::string_view name() const noexcept override { return "xsimd"; }
  std::string description() const override { return detail::kernels_description(active_isa()); }
  std::string isa() const override { return std::string(to_string(active_isa())); }
  // What the kernel set computes: grouped K/V heads, decode and bf16 (every ISA alike).
  support supports(const problem& p) const override {
    return detail::driver_support<detail::xsimd_kernel_set<xsimd_isa::sse2>>(p);
  }

 private:
  xsimd_isa active_isa() const { return pinned_ ? *pinned_ : xsimd_default_isa(); }

  std::unique_ptr<plan> make_plan(const config& cfg, formulation form,
                                  const weights& w) const override {
    return detail::make_isa_plan<detail::xsimd_kernel_set>(active_isa(), cfg, form, w, name());
  }

  std::optional<xsimd_isa> pinned_;
};

}  // namespace

const backend& xsimd_backend() {
  static const xsimd_impl instance{std::nullopt};
  return instance;
}

const backend& xsimd_backend(xsimd_isa isa) {
  static const xsimd_impl avx512bf16{xsimd_isa::avx512bf16}, avx512{xsimd_isa::avx512},
      avx2{xsimd_isa::avx2}, sse2{xsimd_isa::sse2};
  const xsimd_impl* pinned = isa == xsimd_isa::avx512bf16 ? &avx512bf16
                             : isa == xsimd_isa::avx512   ? &avx512
                             : isa == xsimd_isa::avx2     ? &avx2
                             : isa == xsimd_isa::sse2     ? &sse2
                                                          : nullptr;
  if (pinned == nullptr) {
    throw invalid_argument(text("xsimd: unknown xsimd_isa value ", static_cast<int>(isa),
                                "; expected avx512bf16, avx512, avx2 or sse2"));
  }
  if (!detail::cpu_runs(isa)) {
    throw invalid_argument(text("xsimd: this CPU does not support ", to_string(isa),
                                "; it supports ", detail::isa_names(xsimd_supported_isas())));
  }
  return *pinned;
}

}  // namespace mha
