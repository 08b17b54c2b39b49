// The timing loop of the kernel benchmarks (bench_gemm, bench_attention): run once, check, then
// time; rate counters against the measured FMA peak.
#pragma once

#include <benchmark/benchmark.h>

#include <functional>
#include <string>

#include "core/text.hpp"
#include "fma_peak.hpp"

namespace mha_bench {

// Google Benchmark's start-up: its flags parsed (false when one is unknown, reported), then the
// FP32 FMA peak of one core measured into peak_gflops_per_core and recorded in the context.
inline bool initialize(int* argc, char** argv, double& peak_gflops_per_core) {
  benchmark::Initialize(argc, argv);
  if (benchmark::ReportUnrecognizedArguments(*argc, argv)) return false;
  const fma_peak peak = measure_fma_peak(1);
  peak_gflops_per_core = peak.gflops_one_core;
  benchmark::AddCustomContext(
      "peak_gflops_per_core",
      mha::detail::text(peak_gflops_per_core, " (measured, ", peak.isa, " FMA loop)"));
  return true;
}

// Runs kernel() once and check() (a message when the result is wrong: the benchmark is skipped
// with it, and false returned), then times kernel() and sets the counters GFLOPS (gflop per
// call) and pct_peak (against `threads` x peak_gflops_per_core).
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
