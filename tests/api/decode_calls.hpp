// The decode tests' calls (test_decode.cpp, test_decode_long.cpp): a generation loop's calls
// through a KV cache, the plan's full forward, and how their rows are compared (bit for bit
// where the backend decodes with its forward's kernels: mha_test::decodes_bitwise).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "mha/mha.hpp"
#include "mha_testing.hpp"
#include "reference.hpp"
#include "support.hpp"

// The tests' names, brought into each test file with one using-directive.
namespace mha_test::decode_calls {

using mha::formulation;
using mha_test::shape;

// Rows [first, first + count) of every sequence of a (batch, seq_len, width) tensor.
inline std::vector<float> rows_of(const std::vector<float>& t, std::int64_t batch,
                                  std::int64_t seq_len, std::int64_t width, std::int64_t first,
                                  std::int64_t count) {
  std::vector<float> out;
  for (std::int64_t b = 0; b < batch; ++b) {
    const auto from = t.begin() + (b * seq_len + first) * width;
    out.insert(out.end(), from, from + count * width);
  }
  return out;
}

// The calls of a generation loop over x (batch, seq_len, d_in): `prefill` tokens, then `chunk`
// at a time. f(at, t) for each call of tokens [at, at + t).
template <class F>
void for_each_call(std::int64_t seq_len, std::int64_t prefill, std::int64_t chunk, F&& f) {
  for (std::int64_t at = 0; at < seq_len;) {
    const std::int64_t t = std::min(at == 0 ? prefill : chunk, seq_len - at);
    f(at, t);
    at += t;
  }
}

// Feeds x through `cache` call by call; returns the calls' outputs as one (batch, seq_len,
// d_out) tensor.
inline std::vector<float> incremental(const mha::plan& p, mha::kv_cache& cache,
                                      const std::vector<float>& x, std::int64_t batch,
                                      std::int64_t seq_len, std::int64_t prefill,
                                      std::int64_t chunk, const mha::run_options& options = {}) {
  const mha::config& cfg = p.config();
  std::vector<float> y(static_cast<std::size_t>(batch * seq_len * cfg.d_out));
  for_each_call(seq_len, prefill, chunk, [&](std::int64_t at, std::int64_t t) {
    const std::vector<float> xs = rows_of(x, batch, seq_len, cfg.d_in, at, t);
    std::vector<float> ys(static_cast<std::size_t>(batch * t * cfg.d_out));
    p.run({xs.data(), batch, t, cfg.d_in}, {ys.data(), batch, t, cfg.d_out}, cache, options);
    for (std::int64_t b = 0; b < batch; ++b) {
      std::copy_n(ys.begin() + b * t * cfg.d_out, t * cfg.d_out,
                  y.begin() + (b * seq_len + at) * cfg.d_out);
    }
  });
  return y;
}

// The full forward of x, the causal calls' expected rows.
inline std::vector<float> full_forward(const mha::plan& p, const std::vector<float>& x,
                                       std::int64_t batch, std::int64_t seq_len,
                                       const mha::run_options& options = {}) {
  const mha::config& cfg = p.config();
  std::vector<float> y(static_cast<std::size_t>(batch * seq_len * cfg.d_out));
  p.run({x.data(), batch, seq_len, cfg.d_in}, {y.data(), batch, seq_len, cfg.d_out}, options);
  return y;
}

// Incremental rows against the full forward's: bit for bit on the backends whose incremental
// calls run the kernels of their full forward (mha_test::decodes_bitwise), within twice the
// conformance bound (each side within 1e-5 * max|y| of the oracle) on the others.
inline testing::AssertionResult same_rows(const mha::backend& backend,
                                          const std::vector<float>& got,
                                          const std::vector<float>& expected) {
  if (got.size() != expected.size()) {
    return testing::AssertionFailure() << got.size() << " values, expected " << expected.size();
  }
  if (mha_test::decodes_bitwise(backend)) {
    if (got == expected) return testing::AssertionSuccess();
    return testing::AssertionFailure()
           << "not bitwise equal: max |difference| " << mha_test::max_abs_diff(got, expected);
  }
  const double difference = mha_test::max_abs_diff(got, expected),
               bound = 2e-5 * mha_test::max_abs(expected);
  if (difference <= bound) return testing::AssertionSuccess();
  return testing::AssertionFailure() << "max |difference| " << difference << " > " << bound;
}

// What the calls of a generation loop over x must give: for each call of tokens [at, at + t),
// rows [at, at + t) of the forward pass over the tokens fed so far, [0, at + t). Causal, that is
// the plan's own full forward over the whole sequence (same_rows); non-causal, a query sees the
// tokens fed up to its call and none later, checked against the double oracle of each prefix
// within the conformance bound (a full forward per call would build oneDNN primitives for
// every length).
inline testing::AssertionResult matches_calls(const mha::backend& backend, const mha::plan& p,
                                              const mha::weights& w, const std::vector<float>& x,
                                              const std::vector<float>& got, std::int64_t batch,
                                              std::int64_t seq_len, std::int64_t prefill,
                                              std::int64_t chunk,
                                              const mha::run_options& options = {}) {
  const mha::config& cfg = p.config();
  if (cfg.causal) return same_rows(backend, got, full_forward(p, x, batch, seq_len, options));
  std::vector<double> expected(got.size());
  for_each_call(seq_len, prefill, chunk, [&](std::int64_t at, std::int64_t t) {
    const std::int64_t n = at + t;
    std::vector<mha_reference::row> rows;
    for (std::int64_t b = 0; b < batch; ++b)
      for (std::int64_t i = at; i < n; ++i) rows.push_back({b, i});
    const std::vector<double> ys = mha_reference::forward_rows(
        cfg, w, rows_of(x, batch, seq_len, cfg.d_in, 0, n), batch, n, rows, options);
    for (std::size_t r = 0; r < rows.size(); ++r) {
      std::copy_n(ys.begin() + static_cast<std::ptrdiff_t>(r) * cfg.d_out, cfg.d_out,
                  expected.begin() + (rows[r].batch * seq_len + rows[r].token) * cfg.d_out);
    }
  });
  const double difference = mha_test::max_abs_diff(got, expected),
               bound = 1e-5 * mha_test::max_abs(expected);
  if (difference <= bound) return testing::AssertionSuccess();
  return testing::AssertionFailure() << "max |y - oracle| " << difference << " > " << bound;
}

// kv_cache::bytes() is the nominal 2 * B * capacity * H_kv * head_dim floats plus the padding of
// the backend's layout: at most the capacity rounded up to 32 keys and head_dim to 32 (the
// widest SIMD panels), and a cache line per head.
// Every formulation caches kv_heads heads (the wrapper one per K/V group).
inline void expect_cache_bytes(const mha::kv_cache& cache, const mha::config& cfg,
                               std::int64_t batch, std::int64_t capacity) {
  const std::int64_t heads = cfg.kv_heads();
  const auto up = [](std::int64_t n) { return (n + 31) / 32 * 32; };
  const std::int64_t hd = cfg.head_dim();
  EXPECT_GE(cache.bytes(), static_cast<std::size_t>(2 * batch * capacity * heads * hd) * 4);
  EXPECT_LE(cache.bytes(),
            static_cast<std::size_t>(batch * heads * (2 * up(capacity) * up(hd) + 16)) * 4);
}

}  // namespace mha_test::decode_calls
