// The oracle: the spec of docs/design.md §1 computed in double, straight from the split-weight
// formulas. Not a backend and not installed: tests compare every backend with it, the benchmark
// checks a sample of rows before timing, and `mha verify` reports errors against it.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "mha/config.hpp"
#include "mha/run_options.hpp"
#include "mha/weights.hpp"

namespace mha_reference {

// The bound of a bf16 module against forward() of the same config (docs/design.md §1.5): a
// backend's max|y - y*| <= bf16_bound * max|y*|, twice bf16's unit roundoff 2^-9.
inline constexpr double bf16_bound = 1.0 / 256;

// One output row: token `token` of batch element `batch`.
struct row {
  std::int64_t batch = 0, token = 0;
};

// y (batch, seq_len, out_width()) for x (batch, seq_len, d_in), every row. In training mode applies
// the shared dropout mask (options.seed, cfg.dropout), so it matches backends there too. With
// cfg.precision bf16, the function of docs/design.md §1.5 computed in double: the parameters
// and the operands of every product (x, Q, K, V, the unnormalised softmax weights P, the heads'
// merged output) rounded to bf16, everything else exact.
std::vector<double> forward(const mha::config& cfg, const mha::weights& w, std::span<const float> x,
                            std::int64_t batch, std::int64_t seq_len,
                            const mha::run_options& options = {});

// Only the requested rows: result[r * out_width() + e] is y[rows[r].batch][rows[r].token][e]. Costs
// O(seq_len * d_in * d_out) per distinct batch element plus O(seq_len * d_out) per row, so a few
// rows of a large problem are cheap to check.
// zero_past > 0: x is an incremental call's tokens after `zero_past` tokens of x = 0 (whose keys
// and values are the K/V biases, 0 without qkv_bias), token i at position zero_past + i: the
// state mha_bench's decode benchmarks start from. Adds O(zero_past * d_out) per row.
std::vector<double> forward_rows(const mha::config& cfg, const mha::weights& w,
                                 std::span<const float> x, std::int64_t batch, std::int64_t seq_len,
                                 std::span<const row> rows, const mha::run_options& options = {},
                                 std::int64_t zero_past = 0);

// The largest |scale * q_i . k_j| over the (i, j) pairs the module attends to (causal: j <= i),
// in double, fp32 arithmetic: how sharp the softmax is, which bounds how far rounded operands
// move its weights (docs/design.md §1.5).
double max_abs_score(const mha::config& cfg, const mha::weights& w, std::span<const float> x,
                     std::int64_t batch, std::int64_t seq_len);

// The bound of an int8 KV cache (docs/design.md §1.7) on y of `cfg` against forward(): codes
// move each cached element by at most e max|k| (e max|v|; e = int8_element_error, about
// 1/252), a score by at most delta = sqrt(head_dim) max|q| max|k| e (the softmax scale
// 1 / sqrt(head_dim) times head_dim products; plus the 16-bit queries' share), each weight by a
// factor within exp(+-2 delta), so the heads' outputs by at most
// max|v| ((e^(2 delta) - 1)(1 + e) + e_v) (e_v = int8_value_error: the values' codes and the
// SIMD kernels' 16-bit weights, 1.25 e), and y by out_proj's largest row sum of
// |W| times that. max|q|, max|k|, max|v| are the projections' over the first `rows` rows of x
// (rows x d_in: every token whose keys and values are cached; times sqrt 2 with RoPE, which
// mixes pairs). Plus the fp32 function's own rounding, 1e-5 max_y (max_y: max|y| of forward()).
// Absolute, like max|y - y*|.
// A k8v4 cache (kv): its keys' share as int8's; its values' from the turned groups of the value
// rows (base/value4.hpp), computed from them: each element of a value row read back within
// sqrt(32) value4_element_error times the largest range of a turned group, and the SIMD
// kernels' 16-bit weights within value4_weight_error times the largest turned element. An int4
// cache (kv): its values' share as k8v4's; its keys' codes move a score by at most
// sqrt(head_dim) max|q| 2 max|k| key4_element_error (an element within that of its channel
// group's range), plus its 16-bit queries' share (key4_query_limit).
double int8_cache_bound(const mha::config& cfg, const mha::weights& w, std::span<const float> x,
                        std::int64_t rows, double max_y, mha::precision kv = mha::precision::int8);

// The bound of the SIMD kernels' int8 arithmetic against the naive backend's, which widens each
// code to its value and computes the function of those in fp32: the SIMD kernels' 16-bit queries
// move a score by at most delta_q = sqrt(head_dim) max|q| max|k| / query_code_limit, and their
// 16-bit weights an output by at most (int8_value_error - int8_element_error) max|v|, so y by at
// most out_proj's largest row sum of |W| times max|v| ((e^(2 delta_q) - 1)(1 + e) +
// int8_value_error - e), plus 1e-5 max_y of fp32 rounding (docs/design.md §1.7). Absolute.
// A k8v4 cache (kv): its keys' share as int8's; its 16-bit weights of the 4-bit values' move an
// output by at most value4_weight_error max|u| (u: the turned values, max|u| <= sqrt(32) max|v|)
// in place of int8's (base/value4.hpp). An int4 cache (kv): as k8v4's, its 16-bit queries made
// per key group over key4_query_limit.
double int8_kernels_bound(const mha::config& cfg, const mha::weights& w, std::span<const float> x,
                          std::int64_t rows, double max_y,
                          mha::precision kv = mha::precision::int8);

// The attention core alone (no projections), for checking attention kernels: q, k, v and the
// result are (batch, heads, seq_len, head_dim), dense row-major.
struct attention_shape {
  std::int64_t batch = 1, heads = 1, seq_len = 1, head_dim = 1;
  bool causal = true;
  // Training-mode dropout on the attention weights with the shared mask of (seed, b, h, i, j),
  // as forward() applies it in training mode; 0 = none.
  float dropout = 0.0f;
  std::uint64_t seed = 0;
  // A sliding window (docs/design.md §1.9): -inf for j <= i - window too; 0 = none.
  std::int64_t window = 0;
};

// Row i of head (b, h): softmax_j(q_i . k_j / sqrt(head_dim), -inf for j > i when causal and
// for j <= i - window with a window), dropout applied, times V; head_dim values.
std::vector<double> attention_row(const attention_shape& shape, std::span<const float> q,
                                  std::span<const float> k, std::span<const float> v,
                                  std::int64_t b, std::int64_t h, std::int64_t i);

}  // namespace mha_reference
