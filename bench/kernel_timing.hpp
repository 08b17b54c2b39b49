// Start-up and the timing loop of the kernel benchmarks (bench_gemm, bench_attention): the ISA
// flag, the machine context, run once, check, then time; rate counters against the measured
// FMA peak of the ISA each kernel runs.
#pragma once

#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdlib>
#include <functional>
#include <iostream>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/text.hpp"
#include "machine/fma_peak.hpp"
#include "machine/machine_context.hpp"
#include "mha/backends/xsimd.hpp"

#if MHA_BENCH_ONEDNN
#include <dnnl.h>

#include "mha/backends/onednn.hpp"
#endif

namespace mha_bench {

// `--isa NAME` (or `--isa=NAME`) taken out of argv, NAME one of the ISAs this CPU runs the xsimd
// kernels on (mha::xsimd_supported_isas): it caps this process's xsimd kernels (MHA_XSIMD_ISA,
// which the tbb framework follows) and oneDNN (ONEDNN_MAX_CPU_ISA: mha::onednn_isa_cap) before
// either is first used, so both sides of a comparison run the same instruction set. Then Google
// Benchmark's flags (an unknown one is reported), the machine context, what the kernels compared
// are (xsimd's description; oneDNN's version, its threading as `onednn_threading` says, and its
// description) and the FMA peak of every ISA. nullopt, after saying why, on a bad flag.
inline std::optional<fma_peak> initialize(int* argc, char** argv,
                                          [[maybe_unused]] std::string_view onednn_threading) {
  std::string isa;
  int kept = 1;
  for (int i = 1; i < *argc; ++i) {
    const std::string_view a = argv[i];
    if (a == "--isa" && i + 1 < *argc) {
      isa = argv[++i];
    } else if (a.starts_with("--isa=")) {
      isa = a.substr(6);
    } else {
      argv[kept++] = argv[i];
    }
  }
  *argc = kept;
  if (!isa.empty()) {
    const std::vector<mha::isa> runnable = mha::xsimd_supported_isas();
    const std::optional<mha::isa> capped = mha::parse_isa(isa);
    if (!capped || std::ranges::count(runnable, *capped) == 0) {
      std::cerr << argv[0] << ": --isa '" << isa << "': expected one of";
      for (mha::isa i : runnable) std::cerr << ' ' << mha::to_string(i);
      std::cerr << " (the ISAs this CPU runs the xsimd kernels on)\n";
      return std::nullopt;
    }
    setenv("MHA_XSIMD_ISA", isa.c_str(), 1);
#if MHA_BENCH_ONEDNN
    if (const std::optional<std::string_view> cap = mha::onednn_isa_cap(*capped))
      setenv("ONEDNN_MAX_CPU_ISA", std::string(*cap).c_str(), 1);
#endif
  }
  benchmark::Initialize(argc, argv);
  if (benchmark::ReportUnrecognizedArguments(*argc, argv)) return std::nullopt;
  add_machine_context();
  benchmark::AddCustomContext("mha_isa_overrides", isa_overrides());
  benchmark::AddCustomContext("xsimd", mha::xsimd_backend().description());
#if MHA_BENCH_ONEDNN
  const dnnl_version_t* v = dnnl_version();
  benchmark::AddCustomContext(
      "onednn", mha::detail::text(v->major, ".", v->minor, ".", v->patch, ", ", onednn_threading,
                                  ", ", mha::onednn_backend().description()));
#endif
  fma_peak peak = measure_fma_peak(1);
  add_peak_context(peak);
  return peak;
}

// Runs kernel() once and check() (a message when the result is wrong: the benchmark is skipped
// with it, and false returned), then times kernel() and sets the counters GFLOPS (gflop per
// call) and pct_peak (against `threads` x peak_gflops_per_core, the peak of the kernel's ISA).
inline bool check_then_time(benchmark::State& state, const std::function<void()>& kernel,
                            const std::function<std::string()>& check, double gflop,
                            double peak_gflops_per_core, int threads = 1) {
  kernel();
  if (const std::string error = check(); !error.empty()) {
    state.SkipWithError(error.c_str());
    return false;
  }
  for (auto _ : state) {
    kernel();
    benchmark::ClobberMemory();
  }
  state.counters["GFLOPS"] =
      benchmark::Counter(gflop, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["pct_peak"] = benchmark::Counter(gflop * 100.0 / (threads * peak_gflops_per_core),
                                                  benchmark::Counter::kIsIterationInvariantRate);
  return true;
}

}  // namespace mha_bench
