// The aarch64 side of the dispatch (kernels/dispatch.cpp): no row needs a probe (NEON is the
// baseline), no x86 extension exists here, and the kernels' description names what the CPU has
// beyond NEON that they leave unused (from the kernel's HWCAP words). Compiled with the baseline
// flags.
#include <asm/hwcap.h>
#include <sys/auxv.h>

#include <string>
#include <vector>

#include "kernels/interface/dispatch.hpp"

namespace mha::detail {

const std::string& amx_refusal() noexcept {
  static const std::string reason = "AMX is an x86-64 extension and this is an aarch64 build";
  return reason;
}

std::string refusal_note(mha::isa which) {
  return which == isa::amx ? " (" + amx_refusal() + ")" : "";
}

std::string description_note(mha::isa) {
  const unsigned long hwcap = getauxval(AT_HWCAP), hwcap2 = getauxval(AT_HWCAP2);
  std::vector<std::string> unused;
  if ((hwcap & HWCAP_SVE) != 0) unused.emplace_back("SVE");
  if ((hwcap2 & HWCAP2_BF16) != 0) unused.emplace_back("BF16");
  std::string note;
  for (const std::string& name : unused) note += (note.empty() ? "" : ", ") + name;
  return note.empty() ? "" : ", the CPU's " + note + " unused (NEON kernels)";
}

}  // namespace mha::detail
