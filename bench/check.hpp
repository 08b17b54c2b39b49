// mha_bench: the check every benchmark passes before it is timed. The output of one run is
// compared with the double-precision oracle (mha_reference) on a sample of rows; the oracle is
// computed once per shape and shared by every backend, formulation and thread count.
#pragma once

#include <cstdint>
#include <filesystem>
#include <span>
#include <vector>

#include "mha/weights.hpp"
#include "reference.hpp"
#include "sweep.hpp"

namespace mha_bench {

// The check passes when max|y - reference| <= tolerance * max|reference| over the sampled rows.
// Why 1e-4: a float32 dot product of K random-sign terms has a rounding error of about
// sqrt(K) * 2^-24 relative to its result (4.7e-6 at K = 6144, the largest d_in of any preset;
// the worst case K * 2^-24 = 3.7e-4 needs every rounding to go the same way), and a forward
// pass chains three such products (projection, A V, out_proj; attention's K = head_dim is
// shorter). Measured with the least accurate backend, naive (serial float sums): 9.5e-7 of
// max|y| at d_model 768, 2.6e-6 at d_model 3072 and 6144. So 1e-4 keeps a ~40x margin at the
// largest shapes, while any real bug (a wrong head, mask, scale or bias) moves y by O(max|y|).
inline constexpr double default_tolerance = 1e-4;

// Rows of a (batch, seq_len) output the check compares: batch elements 0 and batch - 1, tokens
// 0, seq_len / 3, 2 * seq_len / 3 and seq_len - 1, each row once. The last token attends to
// every other one, the first to itself only. At most 8 rows; the oracle costs O(seq_len *
// d_in * d_out) per distinct batch element.
std::vector<mha_reference::row> sample_rows(std::int64_t batch, std::int64_t seq_len);

struct check_result {
  std::size_t rows = 0;      // rows compared
  double max_error = 0;      // max |y - reference| over them (NaN when y has a NaN)
  double max_reference = 0;  // max |reference| over them

  double relative_error() const noexcept;        // max_error / max_reference (max_error when 0)
  bool passed(double tolerance) const noexcept;  // false for NaN
};

// Compares rows of y (batch, seq_len, d_out), row-major, with reference[r * d_out + e], the
// oracle's values for rows[r] (the layout of mha_reference::forward_rows).
check_result compare_rows(std::span<const float> y, std::int64_t seq_len, std::int64_t d_out,
                          std::span<const mha_reference::row> rows,
                          std::span<const double> reference);

// The inputs of one shape (a problem in any formulation: they all compute the same function)
// and the oracle on its sampled rows: weights as nn.Linear initialises them
// (mha::weights::random, fixed seed) and x uniform in [-1, 1) (fixed seed); with past > 0, x is
// a decode call's tokens after `past` zero tokens (mha_reference::forward_rows). Building it
// costs O(seq_len * d_in * d_out) in double per sampled batch element, about 8 s at B1 T128
// d_model 6144 here; a sweep builds it once per shape. Immutable after construction.
class shape_fixture {
 public:
  explicit shape_fixture(const mha::problem& shape);

  // The shape, in the formulation it was given in.
  const mha::problem& problem() const noexcept { return problem_; }
  const mha::weights& weights() const noexcept { return weights_; }
  // (batch, seq_len, d_in), row-major.
  std::span<const float> x() const noexcept { return x_; }
  // The checked rows (sample_rows) and the oracle's values on them (rows x d_out).
  std::span<const mha_reference::row> rows() const noexcept { return rows_; }
  std::span<const double> reference() const noexcept { return reference_; }
  // Compares a forward pass's output y (batch, seq_len, d_out) with the oracle.
  check_result check(std::span<const float> y) const;
  // With an int8 KV cache, how much further from the oracle than the plan's precision allows
  // y may be, relative to max|reference|: mha_reference::int8_cache_bound on the call's tokens
  // (the zero cached tokens are exact codes) over max|reference|. 0 for another cache.
  double int8_cache_tolerance() const noexcept { return int8_cache_tolerance_; }

 private:
  mha::problem problem_;
  mha::weights weights_;
  std::vector<float> x_;
  std::vector<mha_reference::row> rows_;
  std::vector<double> reference_;
  double int8_cache_tolerance_ = 0;
};

// The fixture as a safetensors file at `path`: the weights as the split layout's state_dict
// (mha::io::to_state_dict), "x" (batch, seq_len, d_in), "check.rows" (rows, 2: batch element
// and token of each checked row) and "check.reference" (rows, d_out: the oracle, rounded to
// float32), with the metadata "problem" = the problem string after its formulation. What
// tools/tests pin mhapy.inputs and mhapy.oracle to. Throws mha::error when it cannot write.
void write_fixture(const shape_fixture& fixture, const std::filesystem::path& path);

}  // namespace mha_bench
