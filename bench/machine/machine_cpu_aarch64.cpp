// The machine context's CPU on aarch64 (machine_cpu.hpp): the core named from its MIDR
// (implementer and part, as /proc/cpuinfo's "CPU implementer" and "CPU part" give them, or
// MIDR_EL1 itself where the kernel lets user code read it), the features from the kernel's HWCAP
// words, and whether an emulator runs the code.
#include <asm/hwcap.h>
#include <sys/auxv.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "machine_context.hpp"
#include "machine_cpu.hpp"
#include "sweep.hpp"

namespace mha_bench {
namespace {

struct known_core {
  unsigned implementer, part;
  const char* name;
};

// The cores of the Arm servers that serve inference (Graviton 2/3/4, Ampere Altra, Axion,
// Grace) and common others; the rest are named by their numbers.
constexpr known_core known_cores[] = {
    {0x41, 0xd0c, "Arm Neoverse N1"},       {0x41, 0xd40, "Arm Neoverse V1"},
    {0x41, 0xd49, "Arm Neoverse N2"},       {0x41, 0xd4f, "Arm Neoverse V2"},
    {0x41, 0xd84, "Arm Neoverse V3"},       {0x41, 0xd8e, "Arm Neoverse N3"},
    {0x41, 0xd03, "Arm Cortex-A53"},        {0x41, 0xd05, "Arm Cortex-A55"},
    {0x41, 0xd07, "Arm Cortex-A57"},        {0x41, 0xd08, "Arm Cortex-A72"},
    {0x41, 0xd0b, "Arm Cortex-A76"},        {0x41, 0xd41, "Arm Cortex-A78"},
    {0x41, 0xd44, "Arm Cortex-X1"},         {0x41, 0xd47, "Arm Cortex-A710"},
    {0x48, 0xd01, "HiSilicon Kunpeng 920"}, {0x46, 0x001, "Fujitsu A64FX"},
    {0xc0, 0xac3, "Ampere AmpereOne"},
};

// "Arm Neoverse V2", or the numbers ("aarch64 CPU implementer 0x41 part 0xd4f").
std::string core_name(unsigned implementer, unsigned part) {
  for (const known_core& c : known_cores) {
    if (c.implementer == implementer && c.part == part) return c.name;
  }
  char numbers[64];
  std::snprintf(numbers, sizeof numbers, "aarch64 CPU implementer 0x%x part 0x%x", implementer,
                part);
  return numbers;
}

// Whether /proc/cpuinfo describes an x86 CPU: qemu-user (7.2) shows the host's to aarch64 code.
bool cpuinfo_is_x86() { return !cpuinfo_value("vendor_id").empty(); }

}  // namespace

std::string cpu_model() {
  const std::string implementer = cpuinfo_value("CPU implementer"),
                    part = cpuinfo_value("CPU part");
  std::string model;
  if (!implementer.empty() && !part.empty()) {
    model = core_name(static_cast<unsigned>(std::strtoul(implementer.c_str(), nullptr, 0)),
                      static_cast<unsigned>(std::strtoul(part.c_str(), nullptr, 0)));
  } else if ((getauxval(AT_HWCAP) & HWCAP_CPUID) != 0) {
    // The kernel (or the emulator) lets user code read the ID registers.
    std::uint64_t midr = 0;
    __asm__ volatile("mrs %0, MIDR_EL1" : "=r"(midr));
    model = core_name(static_cast<unsigned>(midr >> 24) & 0xffu,
                      static_cast<unsigned>(midr >> 4) & 0xfffu);
  } else {
    model = "unknown aarch64 CPU";
  }
  if (cpuinfo_is_x86()) model += " (emulated on " + cpuinfo_value("model name") + ")";
  return model;
}

std::string cpu_features() {
  const unsigned long hwcap = getauxval(AT_HWCAP), hwcap2 = getauxval(AT_HWCAP2);
  std::vector<std::string> features;
  const auto add = [&](const char* name, bool present) {
    if (present) features.emplace_back(name);
  };
  // /proc/cpuinfo's names of the HWCAP bits that matter to these kernels or to what could come.
  add("asimd", (hwcap & HWCAP_ASIMD) != 0);
  add("asimdhp", (hwcap & HWCAP_ASIMDHP) != 0);
  add("asimddp", (hwcap & HWCAP_ASIMDDP) != 0);
  add("asimdfhm", (hwcap & HWCAP_ASIMDFHM) != 0);
  add("sve", (hwcap & HWCAP_SVE) != 0);
  add("sve2", (hwcap2 & HWCAP2_SVE2) != 0);
  add("bf16", (hwcap2 & HWCAP2_BF16) != 0);
  add("i8mm", (hwcap2 & HWCAP2_I8MM) != 0);
  add("svebf16", (hwcap2 & HWCAP2_SVEBF16) != 0);
  return features.empty() ? "unknown" : join(features, " ");
}

std::string cpu_emulation() {
  const char* named = std::getenv("MHA_EMULATION");
  if (named != nullptr && *named != '\0') return named;
  if (cpuinfo_is_x86()) {
    return "an emulator (qemu-user or alike): aarch64 code, and /proc/cpuinfo describes an x86 "
           "CPU (" +
           cpuinfo_value("model name") + ")";
  }
  return "";
}

}  // namespace mha_bench
