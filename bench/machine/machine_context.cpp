#include "machine_context.hpp"

#include <benchmark/benchmark.h>

#include <cstdlib>
#include <fstream>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "build_info.hpp"
#include "machine_cpu.hpp"
#include "mha/build_config.hpp"
#include "printed.hpp"
#include "sweep.hpp"

namespace mha_bench {

std::string cpuinfo_value(std::string_view key) {
  std::ifstream cpuinfo("/proc/cpuinfo");
  for (std::string line; std::getline(cpuinfo, line);) {
    // "key<tabs>: value"
    const std::size_t colon = line.find(':');
    if (colon == std::string::npos || !line.starts_with(key)) continue;
    const std::size_t end = line.find_last_not_of(" \t", colon - 1);
    if (end + 1 != key.size()) continue;
    return colon + 2 <= line.size() ? line.substr(colon + 2) : "";
  }
  return "";
}

namespace {

std::string compiler() {
#if defined(__clang__)
  return "clang " __clang_version__;
#elif defined(__GNUC__)
  return "gcc " __VERSION__;
#else
  return "unknown";
#endif
}

std::string gflops(double value) { return printed("%.1f", value); }

}  // namespace

void add_machine_context() {
  // The result files' schema version: tools/mhapy/schema.py (SCHEMA_VERSION) says what each
  // version's context holds, and upgrades older files for the report; the two agree
  // (tests/bench/bench_smoke.py).
  benchmark::AddCustomContext("mha_schema_version", "3");
  benchmark::AddCustomContext("mha_version", MHA_VERSION);
  benchmark::AddCustomContext("mha_cpu_model", cpu_model());
  benchmark::AddCustomContext("mha_cpu_isa", cpu_features());
  // Empty on the CPU itself; under an emulator the timings are the emulator's, not the CPU's.
  benchmark::AddCustomContext("mha_emulation", cpu_emulation());
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
  const auto gbps = [](double v) { return printed("%.2f", v); };
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
