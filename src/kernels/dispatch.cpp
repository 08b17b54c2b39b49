// Which ISA's kernels run: the table per ISA, what this CPU runs, the default choice
// (MHA_XSIMD_ISA or the best), and the public ISA functions of mha/backends/xsimd.hpp, which the
// xsimd and tbb backends share. Compiled with the baseline flags.
#include "kernels/dispatch.hpp"

#include <algorithm>
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

const isa_kernels& kernels_for(mha::isa which) noexcept {
  switch (which) {
    case isa::avx512bf16:
      return *avx512bf16_kernels();
    case isa::avx512:
      return *kernel_table{}(xsimd::avx512bw{});
    case isa::avx2:
      return *kernel_table{}(xsimd::fma3<xsimd::avx2>{});
    default:  // sse2 (kernels_for is only asked for an ISA of xsimd_supported_isas())
      break;
  }
  return *kernel_table{}(xsimd::sse2{});
}

bool cpu_runs(mha::isa which) noexcept {
  switch (which) {
    case isa::avx512bf16:
      return __builtin_cpu_supports("x86-64-v4") && __builtin_cpu_supports("avx512bf16");
    case isa::avx512:
      return __builtin_cpu_supports("x86-64-v4");
    case isa::avx2:
      return __builtin_cpu_supports("x86-64-v3");
    case isa::sse2:
      return true;  // the x86-64 baseline
    default:        // no xsimd kernels
      return false;
  }
}

// The ISAs xsimd has kernels for, best first.
constexpr mha::isa xsimd_isas[] = {isa::avx512bf16, isa::avx512, isa::avx2, isa::sse2};

mha::isa best_isa() noexcept {
  static const mha::isa best = [] {
    mha::isa picked = xsimd::dispatch<kernel_archs>(kernel_table{})()->isa;
    // AVX512_BF16 is not an arch of xsimd 8.1: the step up from its AVX-512 pick is ours.
    if (picked == isa::avx512 && cpu_runs(isa::avx512bf16)) picked = isa::avx512bf16;
    for (mha::isa i : xsimd_isas) {  // the best that xsimd picked or that the CPU runs below it
      if (i <= picked && cpu_runs(i)) return i;
    }
    return isa::sse2;
  }();
  return best;
}

std::string kernels_description(mha::isa which) {
  const isa_kernels& k = kernels_for(which);
  return text("xsimd ", XSIMD_VERSION_MAJOR, ".", XSIMD_VERSION_MINOR, ".", XSIMD_VERSION_PATCH,
              ", ", k.arch_name, ", ", k.lanes, " lanes");
}

}  // namespace detail

namespace {

using detail::text;

}  // namespace

std::string detail::isa_names(const std::vector<mha::isa>& isas) {
  std::string names;
  for (mha::isa i : isas) names += (names.empty() ? "" : ", ") + std::string(to_string(i));
  return names;
}

std::vector<mha::isa> xsimd_supported_isas() {
  std::vector<mha::isa> isas;
  for (mha::isa i : detail::xsimd_isas) {
    if (detail::cpu_runs(i)) isas.push_back(i);
  }
  return isas;
}

mha::isa xsimd_default_isa() {
  const char* env = std::getenv("MHA_XSIMD_ISA");
  if (env == nullptr || *env == '\0') return detail::best_isa();
  const std::string_view wanted(env);
  const std::optional<mha::isa> named = parse_isa(wanted);
  if (!named || std::ranges::find(detail::xsimd_isas, *named) == std::end(detail::xsimd_isas)) {
    throw invalid_argument(text("xsimd: MHA_XSIMD_ISA is '", wanted,
                                "', expected one of avx512bf16, avx512, avx2, sse2"));
  }
  if (!detail::cpu_runs(*named)) {
    throw invalid_argument(text("xsimd: MHA_XSIMD_ISA is '", wanted,
                                "', which this CPU does not support; it supports ",
                                detail::isa_names(xsimd_supported_isas())));
  }
  return *named;
}

}  // namespace mha
