// The machine's streaming-read bandwidth, measured: the yardstick of memory-bound figures (a
// decode step reads its KV cache and the weights once, so its time is bounded below by their
// bytes over this bandwidth). Reusable by any benchmark of bench/ (link mha_fma_peak).
#pragma once

#include <vector>

namespace mha_bench {

struct stream_read {
  int threads = 1;                      // threads of the all-cores figure
  double gbps_one_core = 0;             // best one-thread pass, GB/s (1e9 bytes per second)
  double gbps_all_cores = 0;            // best pass of `threads` threads, each reading its own part
  std::vector<double> one_core_trials;  // every one-thread pass, GB/s
};

// Reads a buffer far larger than any cache (512 MiB, touched once beforehand), each thread its
// own contiguous part as 4 sequential streams side by side: `trials` one-thread passes, then
// `trials` passes of `threads` (>= 1) threads. About 0.1 s per pass on a machine that streams 10
// GB/s.
stream_read measure_stream_read(int threads, int trials = 3);

}  // namespace mha_bench
