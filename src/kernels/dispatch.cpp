// Which ISA's kernels run: the table per ISA, what this CPU runs, and the one dispatched to
// (MHA_XSIMD_ISA or the best), which the xsimd and tbb backends share (xsimd's public
// xsimd_supported_isas and xsimd_default_isa return them). The architecture's own part (its rows,
// what they ask of the CPU) is in kernels/arch/<arch>/. Compiled with the baseline flags.
#include "kernels/interface/dispatch.hpp"

#include <algorithm>
#include <cstdlib>
#include <iterator>
#include <xsimd/config/xsimd_config.hpp>

// What the rows' `runs` ask of the CPU (cpu_has on x86-64).
#include "arch_cpu.hpp"
#include "base/checks.hpp"
#include "base/text.hpp"
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
  MHA_EXPECTS(false && "tile_for: no tile of this ISA has panel width nr");
  return tiles[0];
}

namespace {

// The rows of kernel_isas.def (kernels/arch/<arch>/), best first: each ISA's table and whether this
// CPU runs it.
struct isa_row {
  mha::isa isa;
  const isa_kernels* (*kernels)() noexcept;
  bool (*runs)() noexcept;
};

constexpr isa_row isa_rows[] = {
#define MHA_KERNEL_ISA(name, arch, flags, runs) \
  {isa::name, &name##_kernels, []() noexcept -> bool { return runs; }},
#include "kernel_isas.def"
#undef MHA_KERNEL_ISA
};

const isa_row* row_of(mha::isa which) noexcept {
  for (const isa_row& row : isa_rows) {
    if (row.isa == which) return &row;
  }
  return nullptr;
}

}  // namespace

const isa_kernels& kernels_for(mha::isa which) noexcept {
  const isa_row* row = row_of(which);
  MHA_EXPECTS(row != nullptr && "kernels_for: an isa without kernels (see runnable_isas)");
  return *(row != nullptr ? row : &std::end(isa_rows)[-1])->kernels();
}

bool cpu_runs(mha::isa which) noexcept {
  const isa_row* row = row_of(which);
  return row != nullptr && row->runs();
}

mha::isa best_isa() noexcept {
  static const mha::isa best = [] {
    for (const isa_row& row : isa_rows) {
      if (row.runs()) return row.isa;
    }
    return std::end(isa_rows)[-1].isa;  // the baseline's row always runs
  }();
  return best;
}

std::vector<mha::isa> built_isas() {
  std::vector<mha::isa> isas;
  for (const isa_row& row : isa_rows) isas.push_back(row.isa);
  return isas;
}

std::string kernels_description(mha::isa which) {
  const isa_kernels& k = kernels_for(which);
  std::string description = text("xsimd ", XSIMD_VERSION_MAJOR, ".", XSIMD_VERSION_MINOR, ".",
                                 XSIMD_VERSION_PATCH, ", ", k.arch_name, ", ", k.lanes, " lanes");
  return description + description_note(which);
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

std::vector<mha::isa> detail::runnable_isas() {
  std::vector<mha::isa> isas;
  for (mha::isa i : detail::built_isas()) {
    if (detail::cpu_runs(i)) isas.push_back(i);
  }
  return isas;
}

mha::isa detail::dispatched_isa() {
  const char* env = std::getenv("MHA_XSIMD_ISA");
  if (env == nullptr || *env == '\0') return detail::best_isa();
  const std::string_view wanted(env);
  const std::optional<mha::isa> named = parse_isa(wanted);
  const std::vector<mha::isa> kernels = detail::built_isas();
  if (!named || std::ranges::find(kernels, *named) == kernels.end()) {
    throw invalid_argument(text("xsimd: MHA_XSIMD_ISA is '", wanted, "'",
                                named ? detail::refusal_note(*named) : "", ", expected one of ",
                                detail::isa_names(kernels)));
  }
  if (!detail::cpu_runs(*named)) {
    throw invalid_argument(text("xsimd: MHA_XSIMD_ISA is '", wanted,
                                "', which this CPU does not support", detail::refusal_note(*named),
                                "; it supports ", detail::isa_names(detail::runnable_isas())));
  }
  return *named;
}

}  // namespace mha
