// Shared by the libFuzzer targets: a failed property aborts, which libFuzzer reports as a crash
// with the input that caused it.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "mha/backends/naive.hpp"
#include "mha/config.hpp"
#include "mha/weights.hpp"

namespace mha_fuzz {

inline void require(bool property, const char* what) {
  if (!property) {
    std::fprintf(stderr, "property violated: %s\n", what);
    std::abort();
  }
}

// Bitwise equality, so NaN payloads compare equal to themselves.
inline bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

// A module a reader returned, prepared on the naive backend with the context length it states
// and run on its first positions: what a plan builds from the config (a rotary table of 2^62
// positions once did) must not crash, whatever the file said. x = 0.5 everywhere.
inline void run_first_tokens(const mha::config& cfg, const mha::weights& w) {
  const std::int64_t tokens = cfg.context_length < 2 ? cfg.context_length : 2;
  if (cfg.d_in > 4096 || cfg.d_out > 4096) return;  // a plan's weights: bounded by the file
  const auto plan = mha::naive_backend().prepare(cfg, mha::formulation::split_weight, w);
  std::vector<float> x(static_cast<std::size_t>(tokens * cfg.d_in), 0.5f);
  std::vector<float> y(static_cast<std::size_t>(tokens * cfg.d_out));
  plan->run({x.data(), 1, tokens, cfg.d_in}, {y.data(), 1, tokens, cfg.d_out});
}

}  // namespace mha_fuzz
