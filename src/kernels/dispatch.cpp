// Which ISA's kernels run: the table per ISA, what this CPU runs, the default choice
// (MHA_XSIMD_ISA or the best), and the public ISA functions of mha/backends/xsimd.hpp, which the
// xsimd and tbb backends share. Compiled with the baseline flags.
#include "kernels/dispatch.hpp"

#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <xsimd/config/xsimd_config.hpp>

#include "core/checks.hpp"
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
  MHA_EXPECTS(false && "tile_for: no tile of this ISA has panel width nr");
  return tiles[0];
}

namespace {

// The rows of kernels/kernel_isas.def, best first: each ISA's table and whether this CPU runs it.
struct kernel_isa {
  mha::isa isa;
  const isa_kernels* (*kernels)() noexcept;
  bool (*runs)() noexcept;
};

// The CPU features a row's `runs` names (GCC's names: "x86-64-v4", "avx512bf16", ...).
#define cpu_has(feature) __builtin_cpu_supports(feature)
constexpr kernel_isa kernel_isas[] = {
#define MHA_KERNEL_ISA(name, arch, flags, runs) \
  {isa::name, &name##_kernels, []() noexcept -> bool { return runs; }},
#include "kernels/kernel_isas.def"
#undef MHA_KERNEL_ISA
};
#undef cpu_has

const kernel_isa* row_of(mha::isa which) noexcept {
  for (const kernel_isa& row : kernel_isas) {
    if (row.isa == which) return &row;
  }
  return nullptr;
}

}  // namespace

const isa_kernels& kernels_for(mha::isa which) noexcept {
  const kernel_isa* row = row_of(which);
  MHA_EXPECTS(row != nullptr && "kernels_for: an isa without kernels (see xsimd_supported_isas)");
  return *(row != nullptr ? row : &std::end(kernel_isas)[-1])->kernels();
}

namespace {

// Whether the CPU has AMX tiles with bf16 products: CPUID leaf 7, EDX bits 24 (AMX-TILE) and 22
// (AMX-BF16).
bool cpu_has_amx() noexcept {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx) == 0) return false;
  return (edx & (1u << 24)) != 0 && (edx & (1u << 22)) != 0;
}

// XCR0, the state components the OS saves (XGETBV 0; valid where CPUID 1 says OSXSAVE).
std::uint64_t enabled_xstate() noexcept {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (__get_cpuid(1, &eax, &ebx, &ecx, &edx) == 0 || (ecx & (1u << 27)) == 0) return 0;
  std::uint32_t lo = 0, hi = 0;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (std::uint64_t{hi} << 32) | lo;
}

}  // namespace

const std::string& amx_refusal() noexcept {
  static const std::string reason = []() -> std::string {
    if (!cpu_has_amx()) return "this CPU has no AMX-BF16 tiles";
    if (!cpu_runs(isa::avx512bf16)) return "this CPU has AMX but not AVX512_BF16";
    // XTILECFG and XTILEDATA: state components 17 and 18.
    if ((enabled_xstate() & (3u << 17)) != (3u << 17))
      return "the OS has not enabled the AMX tile state (XCR0 bits 17 and 18)";
    // Linux (5.16 and later) grants the tile data per process, on request.
    constexpr int arch_req_xcomp_perm = 0x1023, xfeature_xtiledata = 18;
    if (syscall(SYS_arch_prctl, arch_req_xcomp_perm, xfeature_xtiledata) != 0) {
      return text(
          "Linux refused this process the AMX tile state (arch_prctl(ARCH_REQ_XCOMP_PERM): ",
          std::strerror(errno), ")");
    }
    return "";
  }();
  return reason;
}

std::string refusal_note(mha::isa which) {
  return which == isa::amx && !amx_refusal().empty() ? " (" + amx_refusal() + ")" : "";
}

bool cpu_runs(mha::isa which) noexcept {
  const kernel_isa* row = row_of(which);
  return row != nullptr && row->runs();
}

mha::isa best_isa() noexcept {
  static const mha::isa best = [] {
    for (const kernel_isa& row : kernel_isas) {
      if (row.runs()) return row.isa;
    }
    return std::end(kernel_isas)[-1].isa;  // the baseline's row always runs
  }();
  return best;
}

std::vector<mha::isa> kernel_isa_list() {
  std::vector<mha::isa> isas;
  for (const kernel_isa& row : kernel_isas) isas.push_back(row.isa);
  return isas;
}

std::string kernels_description(mha::isa which) {
  const isa_kernels& k = kernels_for(which);
  std::string description = text("xsimd ", XSIMD_VERSION_MAJOR, ".", XSIMD_VERSION_MINOR, ".",
                                 XSIMD_VERSION_PATCH, ", ", k.arch_name, ", ", k.lanes, " lanes");
  if (which == isa::amx) description += ", bf16 products on AMX tiles";
  // A CPU with tiles the kernels may not use says why.
  if (which == isa::avx512bf16 && cpu_has_amx() && !amx_refusal().empty())
    description += text(", AMX tiles unused: ", amx_refusal());
  return description;
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
  for (mha::isa i : detail::kernel_isa_list()) {
    if (detail::cpu_runs(i)) isas.push_back(i);
  }
  return isas;
}

mha::isa xsimd_default_isa() {
  const char* env = std::getenv("MHA_XSIMD_ISA");
  if (env == nullptr || *env == '\0') return detail::best_isa();
  const std::string_view wanted(env);
  const std::optional<mha::isa> named = parse_isa(wanted);
  const std::vector<mha::isa> kernels = detail::kernel_isa_list();
  if (!named || std::ranges::find(kernels, *named) == kernels.end()) {
    throw invalid_argument(text("xsimd: MHA_XSIMD_ISA is '", wanted, "', expected one of ",
                                detail::isa_names(kernels)));
  }
  if (!detail::cpu_runs(*named)) {
    throw invalid_argument(text("xsimd: MHA_XSIMD_ISA is '", wanted,
                                "', which this CPU does not support", detail::refusal_note(*named),
                                "; it supports ", detail::isa_names(xsimd_supported_isas())));
  }
  return *named;
}

}  // namespace mha
