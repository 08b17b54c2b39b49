// The x86-64 side of the dispatch (kernels/dispatch.cpp): whether this CPU and its OS grant the
// AMX tiles (CPUID, XCR0, Linux's per-process permission), and what the kernels' description
// adds about them. Compiled with the baseline flags.
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>

#include "base/text.hpp"
#include "kernels/interface/dispatch.hpp"

namespace mha::detail {
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

std::string description_note(mha::isa which) {
  if (which == isa::amx) return ", bf16 products on AMX tiles";
  // A CPU with tiles the kernels may not use says why.
  if (which == isa::avx512bf16 && cpu_has_amx() && !amx_refusal().empty())
    return text(", AMX tiles unused: ", amx_refusal());
  return "";
}

}  // namespace mha::detail
