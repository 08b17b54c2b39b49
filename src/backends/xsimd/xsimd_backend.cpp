// The xsimd backend: the shared wrapper / split-weight drivers over the kernels of one ISA,
// chosen at prepare() (MHA_XSIMD_ISA, else the best this CPU runs).
#include <cstdlib>
#include <optional>
#include <xsimd/config/xsimd_config.hpp>

#include "backends/xsimd/kernel_set.hpp"
#include "core/text.hpp"
#include "mha/backends/xsimd.hpp"
#include "mha/error.hpp"

namespace mha {
namespace {

using detail::text;

constexpr xsimd_isa all_isas[] = {xsimd_isa::avx512, xsimd_isa::avx2, xsimd_isa::sse2};

std::string names_of(const std::vector<xsimd_isa>& isas) {
  std::string names;
  for (xsimd_isa isa : isas) names += (names.empty() ? "" : ", ") + std::string(to_string(isa));
  return names;
}

class xsimd_impl final : public backend {
 public:
  // pinned: the ISA this instance always uses; nullopt follows xsimd_default_isa().
  explicit xsimd_impl(std::optional<xsimd_isa> pinned) : pinned_(pinned) {}

  std::string_view name() const noexcept override { return "xsimd"; }
  std::string description() const override {
    const detail::isa_kernels& k = detail::kernels_for(active_isa());
    return text("xsimd ", XSIMD_VERSION_MAJOR, ".", XSIMD_VERSION_MINOR, ".", XSIMD_VERSION_PATCH,
                ", ", k.arch_name, ", ", k.lanes, " lanes");
  }
  std::string isa() const override { return std::string(to_string(active_isa())); }

 private:
  xsimd_isa active_isa() const { return pinned_ ? *pinned_ : xsimd_default_isa(); }

  std::unique_ptr<plan> make_plan(const config& cfg, formulation form,
                                  const weights& w) const override {
    return detail::make_isa_plan<detail::xsimd_kernel_set>(active_isa(), cfg, form, w, name());
  }

  std::optional<xsimd_isa> pinned_;
};

}  // namespace

std::string_view to_string(xsimd_isa isa) noexcept {
  switch (isa) {
    case xsimd_isa::avx512:
      return "avx512";
    case xsimd_isa::avx2:
      return "avx2";
    case xsimd_isa::sse2:
      return "sse2";
  }
  return "unknown";
}

std::vector<xsimd_isa> xsimd_supported_isas() {
  std::vector<xsimd_isa> isas;
  for (xsimd_isa isa : all_isas) {
    if (detail::cpu_runs(isa)) isas.push_back(isa);
  }
  return isas;
}

xsimd_isa xsimd_default_isa() {
  const char* env = std::getenv("MHA_XSIMD_ISA");
  if (env == nullptr || *env == '\0') return detail::best_isa();
  const std::string_view wanted(env);
  for (xsimd_isa isa : all_isas) {
    if (to_string(isa) != wanted) continue;
    if (!detail::cpu_runs(isa)) {
      throw invalid_argument(text("xsimd: MHA_XSIMD_ISA is '", wanted,
                                  "', which this CPU does not support; it supports ",
                                  names_of(xsimd_supported_isas())));
    }
    return isa;
  }
  throw invalid_argument(
      text("xsimd: MHA_XSIMD_ISA is '", wanted, "', expected one of avx512, avx2, sse2"));
}

const backend& xsimd_backend() {
  static const xsimd_impl instance{std::nullopt};
  return instance;
}

const backend& xsimd_backend(xsimd_isa isa) {
  static const xsimd_impl avx512{xsimd_isa::avx512}, avx2{xsimd_isa::avx2}, sse2{xsimd_isa::sse2};
  const xsimd_impl* pinned = isa == xsimd_isa::avx512 ? &avx512
                             : isa == xsimd_isa::avx2 ? &avx2
                             : isa == xsimd_isa::sse2 ? &sse2
                                                      : nullptr;
  if (pinned == nullptr) {
    throw invalid_argument(text("xsimd: unknown xsimd_isa value ", static_cast<int>(isa),
                                "; expected avx512, avx2 or sse2"));
  }
  if (!detail::cpu_runs(isa)) {
    throw invalid_argument(text("xsimd: this CPU does not support ", to_string(isa),
                                "; it supports ", names_of(xsimd_supported_isas())));
  }
  return *pinned;
}

}  // namespace mha
