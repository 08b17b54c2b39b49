// FP32 FMA peak of this machine, measured: the yardstick for "% of peak" in reports. A short
// throughput loop of independent FMAs per instruction set, on one core and on all cores.
// Reusable by any benchmark of bench/ (link mha_fma_peak).
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace mha_bench {

struct fma_peak {
  std::string isa;              // kernel of the best one-core figure: "avx512", "avx2", "portable"
  double gflops_one_core = 0;   // GFLOP/s on one thread (1 FMA = 2 FLOPs)
  double gflops_all_cores = 0;  // GFLOP/s of `threads` threads running at once, kernel `isa`
  int threads = 1;
  // One-core GFLOP/s of every kernel this CPU can run, widest first.
  std::vector<std::pair<std::string, double>> one_core_by_isa;
};

// Measures the peak with `threads` (>= 1) threads for the all-cores figure: per kernel, the
// best of 5 runs of about 25 ms on the calling thread; then the best of 3 runs of every thread
// at once (threads are not pinned). Kernels: AVX-512 (x86-64-v4) and AVX2+FMA (x86-64-v3)
// when __builtin_cpu_supports says so, else a portable 4-lane loop (mul + add without FMA
// hardware). Takes about 0.4 s; best-of runs make it robust to other load, not immune.
fma_peak measure_fma_peak(int threads);

}  // namespace mha_bench
