#include "machine_context.hpp"

#include <benchmark/benchmark.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "build_info.hpp"
#include "mha/build_config.hpp"
#include "sweep.hpp"

namespace mha_bench {

std::string cpu_model() {
  std::ifstream cpuinfo("/proc/cpuinfo");
  for (std::string line; std::getline(cpuinfo, line);) {
    if (!line.starts_with("model name")) continue;
    const std::size_t colon = line.find(':');
    if (colon != std::string::npos && colon + 2 <= line.size()) return line.substr(colon + 2);
  }
  return "unknown";
}

namespace {

// The extensions that decide which kernels a backend can use.
std::string cpu_isa() {
  std::vector<std::string> isa;
#if defined(__x86_64__)
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
#endif
  return isa.empty() ? "unknown" : join(isa, " ");
}

std::string compiler() {
#if defined(__clang__)
  return "clang " __clang_version__;
#elif defined(__GNUC__)
  return "gcc " __VERSION__;
#else
  return "unknown";
#endif
}

std::string gflops(double value) {
  char buffer[32];
  std::snprintf(buffer, sizeof buffer, "%.1f", value);
  return buffer;
}

}  // namespace

void add_machine_context() {
  benchmark::AddCustomContext("mha_version", MHA_VERSION);
  benchmark::AddCustomContext("mha_cpu_model", cpu_model());
  benchmark::AddCustomContext("mha_cpu_isa", cpu_isa());
  benchmark::AddCustomContext("mha_hardware_threads",
                              std::to_string(std::max(1u, std::thread::hardware_concurrency())));
  benchmark::AddCustomContext("mha_compiler", compiler());
  benchmark::AddCustomContext("mha_build_type", MHA_BENCH_BUILD_TYPE);
  benchmark::AddCustomContext("mha_cxx_flags", MHA_BENCH_CXX_FLAGS);
  benchmark::AddCustomContext("mha_library_versions", MHA_BENCH_LIBRARY_VERSIONS);
}

void add_peak_context(const fma_peak& peak) {
  const isa_peak& best = peak.best();
  benchmark::AddCustomContext("mha_fma_peak_isa", best.isa);
  benchmark::AddCustomContext("mha_fma_peak_gflops_one_core", gflops(best.gflops_one_core));
  benchmark::AddCustomContext("mha_fma_peak_gflops_all_cores", gflops(best.gflops_all_cores));
  benchmark::AddCustomContext("mha_fma_peak_threads", std::to_string(peak.threads));
  for (const isa_peak& p : peak.by_isa) {
    benchmark::AddCustomContext("mha_fma_peak_gflops_one_core_" + p.isa, gflops(p.gflops_one_core));
    benchmark::AddCustomContext("mha_fma_peak_gflops_all_cores_" + p.isa,
                                gflops(p.gflops_all_cores));
    std::vector<std::string> trials;
    for (double t : p.one_core_trials) trials.push_back(gflops(t));
    benchmark::AddCustomContext("mha_fma_peak_trials_one_core_" + p.isa, join(trials, ","));
  }
  // The native bf16 peaks, mha_bf16_<kind>_peak_*: 0 where not measured. "dot": vdpbf16ps (none
  // on a CPU without AVX512_BF16, whose bf16 kernels widen to FMAs); "tile": AMX tile products
  // (none where the kernels may not use tiles).
  const auto add_native = [&](std::string_view kind, const std::optional<isa_peak>& measured) {
    const isa_peak p = measured.value_or(isa_peak{});
    const std::string key = "mha_bf16_" + std::string(kind) + "_peak_";
    benchmark::AddCustomContext(key + "gflops_one_core", gflops(p.gflops_one_core));
    benchmark::AddCustomContext(key + "gflops_all_cores", gflops(p.gflops_all_cores));
    std::vector<std::string> trials;
    for (double t : p.one_core_trials) trials.push_back(gflops(t));
    benchmark::AddCustomContext(key + "trials_one_core", join(trials, ","));
  };
  add_native("dot", peak.bf16_dot);
  add_native("tile", peak.bf16_tile);
}

void add_bandwidth_context(const stream_read& bandwidth) {
  const auto gbps = [](double v) {
    char buffer[32];
    std::snprintf(buffer, sizeof buffer, "%.2f", v);
    return std::string(buffer);
  };
  benchmark::AddCustomContext("mha_stream_read_gbps_one_core", gbps(bandwidth.gbps_one_core));
  benchmark::AddCustomContext("mha_stream_read_gbps_all_cores", gbps(bandwidth.gbps_all_cores));
  benchmark::AddCustomContext("mha_stream_read_threads", std::to_string(bandwidth.threads));
  std::vector<std::string> trials;
  for (double t : bandwidth.one_core_trials) trials.push_back(gbps(t));
  benchmark::AddCustomContext("mha_stream_read_trials_one_core", join(trials, ","));
}

std::string isa_overrides() {
  std::vector<std::string> set;
  for (const char* name : {"MHA_XSIMD_ISA", "ONEDNN_MAX_CPU_ISA"}) {
    const char* value = std::getenv(name);
    if (value != nullptr && *value != '\0') set.push_back(std::string(name) + "=" + value);
  }
  return join(set, " ");
}

void add_dispatch_context(std::span<const mha::backend* const> backends) {
  std::set<std::string> families;
  std::vector<std::string> each;
  for (const mha::backend* b : backends) {
    const std::string name(b->name());
    const mha::isa isa = b->isa();
    benchmark::AddCustomContext("mha_backend_" + name + "_isa", std::string(mha::to_string(isa)));
    benchmark::AddCustomContext("mha_backend_" + name + "_peak_isa",
                                std::string(mha::fma_peak_of(isa)));
    benchmark::AddCustomContext("mha_backend_" + name + "_bf16_peak_isa",
                                std::string(bf16_peak_isa_for(isa)));
    if (isa == mha::isa::scalar) continue;
    const std::string_view family = mha::fma_peak_of(isa);
    families.emplace(family == "portable" ? "sse2" : family);
    each.push_back(name + " " + std::string(mha::to_string(isa)));
  }
  const std::string dispatch = families.empty()       ? "scalar"
                               : families.size() == 1 ? *families.begin()
                                                      : "mixed (" + join(each, ", ") + ")";
  benchmark::AddCustomContext("mha_dispatch", dispatch);
  benchmark::AddCustomContext("mha_isa_overrides", isa_overrides());
}

}  // namespace mha_bench
