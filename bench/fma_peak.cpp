#include "fma_peak.hpp"

#include <algorithm>
#include <chrono>
#include <latch>
#include <thread>

#include "fma_peak_kernels.hpp"

namespace mha_bench {
namespace {

using kernel = double (*)(std::int64_t rounds, float* sink) noexcept;

struct isa_kernel {
  const char* name;
  kernel run;
};

// Kernels this CPU can run, best first.
std::vector<isa_kernel> supported_kernels() {
  std::vector<isa_kernel> list;
#if defined(__x86_64__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("x86-64-v4")) list.push_back({"avx512", detail::fma_rounds_avx512});
  if (__builtin_cpu_supports("x86-64-v3")) list.push_back({"avx2", detail::fma_rounds_avx2});
#endif
  if (list.empty()) list.push_back({"portable", detail::fma_rounds_portable});
  return list;
}

volatile float sink_for_all;  // the kernels' results land here, so no run is optimised away

using clock = std::chrono::steady_clock;

double seconds_since(clock::time_point start) {
  return std::chrono::duration<double>(clock::now() - start).count();
}

struct timed_run {
  double flops, seconds;
};

timed_run run_once(kernel k, std::int64_t rounds) {
  float sink = 0;
  const auto start = clock::now();
  const double flops = k(rounds, &sink);
  const double seconds = seconds_since(start);
  sink_for_all = sink;
  return {flops, seconds};
}

// Rounds for one run of about `target` seconds.
std::int64_t calibrate(kernel k, double target) {
  std::int64_t rounds = 1 << 14;
  double seconds = run_once(k, rounds).seconds;
  while (seconds < target / 8) {
    rounds *= 4;
    seconds = run_once(k, rounds).seconds;
  }
  return std::max<std::int64_t>(1, static_cast<std::int64_t>(rounds * target / seconds));
}

double best_one_core(kernel k, std::int64_t rounds, int runs) {
  double best = 0;
  for (int r = 0; r < runs; ++r) {
    const timed_run t = run_once(k, rounds);
    best = std::max(best, t.flops / t.seconds * 1e-9);
  }
  return best;
}

// Every thread runs the kernel once, released together; GFLOP/s over the wall time of all.
double all_cores_once(kernel k, std::int64_t rounds, int threads) {
  std::latch go(1);
  std::vector<double> flops(static_cast<std::size_t>(threads));
  std::vector<float> sinks(static_cast<std::size_t>(threads));
  std::vector<std::jthread> workers;
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      go.wait();
      flops[static_cast<std::size_t>(t)] = k(rounds, &sinks[static_cast<std::size_t>(t)]);
    });
  }
  const auto start = clock::now();
  go.count_down();
  for (std::jthread& w : workers) w.join();
  const double seconds = seconds_since(start);
  for (float s : sinks) sink_for_all = s;
  double total = 0;
  for (double f : flops) total += f;
  return total / seconds * 1e-9;
}

}  // namespace

fma_peak measure_fma_peak(int threads) {
  constexpr double run_seconds = 0.025;
  fma_peak peak;
  peak.threads = std::max(1, threads);
  std::int64_t best_rounds = 0;
  kernel best_kernel = nullptr;
  for (const isa_kernel& k : supported_kernels()) {
    const std::int64_t rounds = calibrate(k.run, run_seconds);
    const double gflops = best_one_core(k.run, rounds, 5);
    peak.one_core_by_isa.emplace_back(k.name, gflops);
    if (gflops > peak.gflops_one_core) {
      peak.gflops_one_core = gflops;
      peak.isa = k.name;
      best_kernel = k.run;
      best_rounds = rounds;
    }
  }
  for (int r = 0; r < 3; ++r) {
    peak.gflops_all_cores =
        std::max(peak.gflops_all_cores, all_cores_once(best_kernel, best_rounds, peak.threads));
  }
  return peak;
}

}  // namespace mha_bench
