#include "fma_peak.hpp"

#include <algorithm>
#include <chrono>
#include <latch>
#include <thread>

#include "fma_peak_kernels.hpp"

#if MHA_PEAK_KERNELS
#include "kernels/interface/isa_kernels.hpp"
#endif

namespace mha_bench {
namespace {

using kernel = double (*)(std::int64_t rounds, float* sink) noexcept;

struct isa_kernel {
  std::string_view name;
  kernel run;
};

// The FMA loops this CPU runs, widest first: per FMA class (mha::fma_peak_of) the loop of the
// best ISA of that class the kernels are built for and this CPU runs (isa_kernels::fma_rounds,
// one per row of kernel_isas.def), then the bench's own portable loop where no such ISA is of
// class "portable" (aarch64: the yardstick of scalar kernels; a build without the SIMD kernels
// measures it alone).
std::vector<isa_kernel> supported_kernels() {
  std::vector<isa_kernel> list;
  const auto listed = [&](std::string_view name) {
    return std::ranges::any_of(list, [&](const isa_kernel& k) { return k.name == name; });
  };
#if MHA_PEAK_KERNELS
  for (mha::isa i : mha::detail::runnable_isas()) {
    if (!listed(mha::fma_peak_of(i)))
      list.push_back({mha::fma_peak_of(i), mha::detail::kernels_for(i).fma_rounds});
  }
#endif
  if (!listed("portable")) list.push_back({"portable", detail::fma_rounds_portable});
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

std::vector<double> one_core_trials(kernel k, std::int64_t rounds, int trials) {
  std::vector<double> gflops;
  for (int r = 0; r < trials; ++r) {
    const timed_run t = run_once(k, rounds);
    gflops.push_back(t.flops / t.seconds * 1e-9);
  }
  return gflops;
}

constexpr double run_seconds = 0.025;
// Runs of run_seconds spent before the trials: a core that has not run wide vectors for a while
// starts them slowly (an Intel Xeon here read 166-176 GFLOP/s on its first AVX-512 trials and
// 217-228 after a quarter second of them).
constexpr int warm_up_runs = 10;

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

// The peak of one loop: warm-up, one-core trials, the best of 3 all-core runs.
isa_peak measure(const isa_kernel& k, int threads, int trials) {
  const std::int64_t rounds = calibrate(k.run, run_seconds);
  run_once(k.run, rounds * warm_up_runs);
  isa_peak p{.isa = std::string(k.name),
             .one_core_trials = one_core_trials(k.run, rounds, std::max(1, trials))};
  p.gflops_one_core = *std::max_element(p.one_core_trials.begin(), p.one_core_trials.end());
  for (int r = 0; r < 3; ++r)
    p.gflops_all_cores = std::max(p.gflops_all_cores, all_cores_once(k.run, rounds, threads));
  return p;
}

}  // namespace

fma_peak measure_fma_peak(int threads, int trials) {
  fma_peak peak;
  peak.threads = std::max(1, threads);
  for (const isa_kernel& k : supported_kernels())
    peak.by_isa.push_back(measure(k, peak.threads, trials));
#if MHA_PEAK_KERNELS
  // The bf16 peaks: of each kind (bf16_peak_isa_for), the loop of the best ISA that has it.
  for (mha::isa i : mha::detail::runnable_isas()) {
    const kernel loop = mha::detail::kernels_for(i).bf16_rounds;
    if (loop == nullptr) continue;
    std::optional<isa_peak>& kind =
        bf16_peak_isa_for(i) == "bf16_tile" ? peak.bf16_tile : peak.bf16_dot;
    if (!kind) kind = measure({mha::to_string(i), loop}, peak.threads, trials);
  }
#endif
  return peak;
}

std::vector<double> fma_trials_one_core(std::string_view isa, int trials) {
  for (const isa_kernel& k : supported_kernels()) {
    if (k.name == isa) return one_core_trials(k.run, calibrate(k.run, run_seconds), trials);
  }
  return {};
}

const isa_peak& fma_peak::best() const {
  return *std::max_element(by_isa.begin(), by_isa.end(), [](const isa_peak& a, const isa_peak& b) {
    return a.gflops_one_core < b.gflops_one_core;
  });
}

const isa_peak& fma_peak::of(std::string_view isa) const {
  for (const isa_peak& p : by_isa) {
    if (p.isa == isa) return p;
  }
  return best();
}

double fma_peak::bf16_one_core(mha::isa kernel_isa) const {
  const std::string_view basis = bf16_peak_isa_for(kernel_isa);
  if (basis == "bf16_tile" && bf16_tile) return bf16_tile->gflops_one_core;
  if (basis == "bf16_dot" && bf16_dot) return bf16_dot->gflops_one_core;
  return of(mha::fma_peak_of(kernel_isa)).gflops_one_core;
}

std::string_view bf16_peak_isa_for(mha::isa kernel_isa) {
  if (kernel_isa == mha::isa::amx) return "bf16_tile";
  return mha::native_bf16(kernel_isa) ? "bf16_dot" : mha::fma_peak_of(kernel_isa);
}

}  // namespace mha_bench
