// Which ISA's kernels run: the table per ISA, what this CPU runs, the default choice
// (MHA_XSIMD_ISA or the best), and the public ISA functions of mha/backends/xsimd.hpp, which the
// xsimd and tbb backends share. Compiled with the baseline flags.
#include "simd/dispatch.hpp"

#include <cassert>
#include <cstdlib>
#include <xsimd/config/xsimd_config.hpp>

#include "core/text.hpp"
#include "mha/error.hpp"

namespace mha {
namespace detail {

int isa_kernels::panel_width(std::int64_t n) const noexcept {
  int best = tiles[0].nr;
  for (int t = 1; t < tile_count; ++t) {
    if (round_up(n, tiles[t].nr) < round_up(n, best)) best = tiles[t].nr;
  }
  return best;
}

tile_shape isa_kernels::tile_for(int nr) const noexcept {
  for (int t = 0; t < tile_count; ++t) {
    if (tiles[t].nr == nr) return tiles[t];
  }
  assert(false && "tile_for: no tile of this ISA has panel width nr");
  return tiles[0];
}

const isa_kernels& kernels_for(xsimd_isa isa) noexcept {
  switch (isa) {
    case xsimd_isa::avx512bf16:
      return *avx512bf16_kernels();
    case xsimd_isa::avx512:
      return *kernel_table{}(xsimd::avx512bw{});
    case xsimd_isa::avx2:
      return *kernel_table{}(xsimd::fma3<xsimd::avx2>{});
    case xsimd_isa::sse2:
      break;
  }
  return *kernel_table{}(xsimd::sse2{});
}

bool cpu_runs(xsimd_isa isa) noexcept {
  switch (isa) {
    case xsimd_isa::avx512bf16:
      return __builtin_cpu_supports("x86-64-v4") && __builtin_cpu_supports("avx512bf16");
    case xsimd_isa::avx512:
      return __builtin_cpu_supports("x86-64-v4");
    case xsimd_isa::avx2:
      return __builtin_cpu_supports("x86-64-v3");
    case xsimd_isa::sse2:
      return true;  // the x86-64 baseline
  }
  return false;
}

xsimd_isa best_isa() noexcept {
  static const xsimd_isa best = [] {
    auto isa = xsimd::dispatch<kernel_archs>(kernel_table{})()->isa;
    // AVX512_BF16 is not an arch of xsimd 8.1: the step up from its AVX-512 pick is ours.
    if (isa == xsimd_isa::avx512 && cpu_runs(xsimd_isa::avx512bf16)) isa = xsimd_isa::avx512bf16;
    while (!cpu_runs(isa)) isa = static_cast<xsimd_isa>(static_cast<int>(isa) + 1);
    return isa;
  }();
  return best;
}

std::string kernels_description(xsimd_isa isa) {
  const isa_kernels& k = kernels_for(isa);
  return text("xsimd ", XSIMD_VERSION_MAJOR, ".", XSIMD_VERSION_MINOR, ".", XSIMD_VERSION_PATCH,
              ", ", k.arch_name, ", ", k.lanes, " lanes");
}

}  // namespace detail

namespace {

using detail::text;

constexpr xsimd_isa all_isas[] = {xsimd_isa::avx512bf16, xsimd_isa::avx512, xsimd_isa::avx2,
                                  xsimd_isa::sse2};

}  // namespace

std::string detail::isa_names(const std::vector<xsimd_isa>& isas) {
  std::string names;
  for (xsimd_isa isa : isas) names += (names.empty() ? "" : ", ") + std::string(to_string(isa));
  return names;
}

std::string_view to_string(xsimd_isa isa) noexcept {
  switch (isa) {
    case xsimd_isa::avx512bf16:
      return "avx512bf16";
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
                                  detail::isa_names(xsimd_supported_isas())));
    }
    return isa;
  }
  throw invalid_argument(text("xsimd: MHA_XSIMD_ISA is '", wanted,
                              "', expected one of avx512bf16, avx512, avx2, sse2"));
}

}  // namespace mha
