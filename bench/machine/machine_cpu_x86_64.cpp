// The machine context's CPU on x86-64 (machine_cpu.hpp): the model from /proc/cpuinfo, the
// extensions from CPUID (__builtin_cpu_supports).
#include <cstdlib>
#include <string>
#include <vector>

#include "machine_context.hpp"
#include "machine_cpu.hpp"
#include "sweep.hpp"

namespace mha_bench {

std::string cpu_model() {
  const std::string model = cpuinfo_value("model name");
  return model.empty() ? "unknown" : model;
}

std::string cpu_features() {
  std::vector<std::string> isa;
  __builtin_cpu_init();
  const auto add = [&](const char* name, bool present) {
    if (present) isa.emplace_back(name);
  };
  add("sse4.2", __builtin_cpu_supports("sse4.2"));
  add("avx2", __builtin_cpu_supports("avx2"));
  add("fma", __builtin_cpu_supports("fma"));
  add("avx512f", __builtin_cpu_supports("avx512f"));
  add("avx512bw", __builtin_cpu_supports("avx512bw"));
  add("avx512vl", __builtin_cpu_supports("avx512vl"));
  add("avx512vnni", __builtin_cpu_supports("avx512vnni"));
  add("avx512bf16", __builtin_cpu_supports("avx512bf16"));
  return isa.empty() ? "unknown" : join(isa, " ");
}

std::string cpu_emulation() {
  const char* named = std::getenv("MHA_EMULATION");
  return named != nullptr ? named : "";
}

}  // namespace mha_bench
