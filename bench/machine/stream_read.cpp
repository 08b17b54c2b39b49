#include "stream_read.hpp"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>
#include <thread>

namespace mha_bench {
namespace {

constexpr std::size_t buffer_bytes = std::size_t{512} << 20;

// Streams read together by one thread: a CPU's prefetchers track several sequential streams,
// and kernels read several at once (a decode step reads a head's keys and values side by
// side). On a 2-core Zen5 VM one stream read 23-27 GB/s, four 29-32, eight 26-34, sixteen 26.
constexpr std::size_t streams = 4;

// XOR of every word of [begin, end), read as `streams` parts in lockstep: integer XOR is
// associative, so the compiler vectorises it without fast-math, and the loop is bound by the
// loads.
std::uint64_t fold(const std::uint64_t* begin, const std::uint64_t* end) noexcept {
  const std::size_t part = static_cast<std::size_t>(end - begin) / streams / 8 * 8;
  std::uint64_t acc[8] = {};
  for (std::size_t i = 0; i < part; i += 8) {
    for (std::size_t s = 0; s < streams; ++s) {
      for (std::size_t k = 0; k < 8; ++k) acc[k] ^= begin[s * part + i + k];
    }
  }
  std::uint64_t all = 0;
  for (std::uint64_t a : acc) all ^= a;
  for (const std::uint64_t* rest = begin + streams * part; rest < end; ++rest) all ^= *rest;
  return all;
}

// GB/s of one pass of `threads` threads over `words`, each over its own part.
double pass(const std::uint64_t* words, std::size_t count, int threads) {
  std::vector<std::uint64_t> sinks(static_cast<std::size_t>(threads));
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::thread> pool;
  const std::size_t part = count / static_cast<std::size_t>(threads);
  for (int t = 1; t < threads; ++t) {
    pool.emplace_back([&, t] {
      const std::uint64_t* first = words + part * static_cast<std::size_t>(t);
      sinks[static_cast<std::size_t>(t)] =
          fold(first, t + 1 == threads ? words + count : first + part);
    });
  }
  sinks[0] = fold(words, threads == 1 ? words + count : words + part);
  for (std::thread& t : pool) t.join();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  // The folds' results must be used, or the reads could be dropped.
  volatile std::uint64_t keep = 0;
  for (std::uint64_t s : sinks) keep = keep ^ s;
  (void)keep;
  return static_cast<double>(count * sizeof(std::uint64_t)) / seconds * 1e-9;
}

}  // namespace

stream_read measure_stream_read(int threads, int trials) {
  const std::size_t count = buffer_bytes / sizeof(std::uint64_t);
  // Value-initialised: every page is touched (and mapped) before the first timed pass.
  const std::unique_ptr<std::uint64_t[]> words(new std::uint64_t[count]());
  for (std::size_t i = 0; i < count; i += 512) words[i] = i;
  stream_read r;
  r.threads = std::max(threads, 1);
  for (int t = 0; t < trials; ++t) r.one_core_trials.push_back(pass(words.get(), count, 1));
  r.gbps_one_core = *std::max_element(r.one_core_trials.begin(), r.one_core_trials.end());
  for (int t = 0; t < trials; ++t)
    r.gbps_all_cores = std::max(r.gbps_all_cores, pass(words.get(), count, r.threads));
  return r;
}

}  // namespace mha_bench
