// mha: per-call options of plan::run.
#pragma once

#include <cstdint>

namespace mha {

class executor;  // mha/executor.hpp

// The most worker threads run_options::threads may ask for: more than any CPU this library
// targets, few enough that an OpenMP runtime asked for them still starts them.
inline constexpr int max_run_threads = 1024;

// The naive and onednn backends hold each head's T x T attention scores (4 * T^2 bytes, onednn
// twice that with its causal mask). Before allocating them, run() throws mha::invalid_argument
// naming T, the bytes needed and the limit when they exceed this many bytes, or the value of the
// environment variable MHA_MAX_SCORE_BYTES (a decimal byte count; raise it to run longer
// sequences there). xsimd and tbb need no T x T scores and have no such limit.
inline constexpr std::uint64_t default_max_score_bytes = std::uint64_t{4} << 30;

// Options of one plan::run call. The defaults are inference on all cores.
struct run_options {
  // Worker threads: 0 = all cores, else 1..max_run_threads (more than the cores oversubscribes
  // them). Single-threaded backends ignore it. naive, xsimd and tbb give bitwise identical
  // results for every value (fixed partitioning); oneDNN does on its AVX-512 kernels and agrees
  // within onednn_thread_tolerance on AVX2 (mha/backends/onednn.hpp).
  int threads = 0;
  // Training mode: apply dropout with config::dropout to the attention weights (docs/design.md
  // §1.1).
  bool training = false;
  // Dropout seed. The mask is a pure function of (seed, b, h, i, j): the same on every backend,
  // thread count and call.
  std::uint64_t seed = 0;
  // Who runs the tbb backend's parallel work, with `threads` (mha/executor.hpp): nullptr, its
  // own oneTBB arena; else this executor (the caller's pool, OpenMP, serial), which must outlive
  // the call. Other backends ignore it.
  const mha::executor* executor = nullptr;
};

}  // namespace mha
