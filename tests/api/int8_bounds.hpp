// The int8 cache's bounds the attention-cache tests hold the kernels to (docs/design.md §1.7),
// shared by test_attention_cache.cpp and test_attention_extensions.cpp.
#pragma once

#include <cmath>
#include <cstdint>

#include "base/int8.hpp"
#include "base/value4.hpp"
#include "mha/config.hpp"

namespace mha_test {

// The worst error of an int8 cache's call over inputs in [-1, 1] (docs/design.md §1.7): a code
// is within e = int8_element_error (about 1/252) of its element, so a score moves by at most
// sum|q_d| e = sqrt(D) e, a softmax weight by the factor exp(2 that) - 1 of itself, and the
// result by int8_value_error (the values' codes and their 16-bit weights', about 2 e) +
// 2 (exp(2 sqrt(D) e) - 1) max|v|.
inline double int8_bound(std::int64_t head_dim) {
  const double e = mha::detail::int8_element_error;
  const double score = std::sqrt(static_cast<double>(head_dim)) * e;
  return mha::detail::int8_value_error + 2.0 * (std::exp(2.0 * score) - 1.0);
}

// The SIMD kernels' int8 arithmetic against naive's over inputs in [-1, 1] (docs/design.md §1.7,
// reference.hpp's int8_kernels_bound): 16-bit queries move a score by at most
// sqrt(D) / query_code_limit, 16-bit weights the result by int8_value_error - e; plus 2e-5 of
// fp32 rounding.
inline double int8_kernels_tolerance(std::int64_t head_dim) {
  const double e = mha::detail::int8_element_error;
  const double score =
      std::sqrt(static_cast<double>(head_dim)) / mha::detail::query_code_limit(head_dim);
  return 2e-5 + std::expm1(2.0 * score) * (1.0 + e) + mha::detail::int8_value_error - e;
}

// ... of a k8v4 cache: its keys as int8's; its 16-bit weights of the turned 4-bit values move the
// result by at most value4_weight_error max|u|, max|u| <= sqrt(32) max|v| (base/value4.hpp), in
// place of int8's weights' share.
inline double k8v4_kernels_tolerance(std::int64_t head_dim) {
  const double e = mha::detail::int8_element_error;
  return int8_kernels_tolerance(head_dim) - (mha::detail::int8_value_error - e) +
         std::sqrt(double{mha::detail::value4_group}) * mha::detail::value4_weight_error;
}
// The kernels' tolerance of a coded cache (int8, k8v4 or int4: its values as k8v4's, its 16-bit
// queries made per key group over key4_query_limit, query_code_limit's 32767 up to head_dim 4368).
inline double kernels_tolerance(mha::precision kv, std::int64_t head_dim) {
  return kv == mha::precision::int8 ? int8_kernels_tolerance(head_dim)
                                    : k8v4_kernels_tolerance(head_dim);
}

}  // namespace mha_test
