// Internal: rotary position embedding (docs/design.md §1.6), shared by every kernel set through
// the driver.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "driver/attention_args.hpp"

namespace mha::detail {

// cos and sin of pos * f_e for every position < `positions` and pair e < head_dim / 2, with f the
// plan's inverse frequencies (mha::rope_frequencies: base^(-2e / head_dim), scaled), computed in
// double and rounded once, so every backend turns a head by the
// same floats (the double oracle computes the angles exactly; PyTorch's Llama computes them in
// float, which differs by up to pos * 2^-24 radians). Memory: positions * head_dim floats.
class rope_table {
 public:
  rope_table(std::int64_t positions, const std::vector<double>& frequencies)
      : half_(static_cast<std::int64_t>(frequencies.size())),
        cos_(static_cast<std::size_t>(positions * half_)),
        sin_(cos_.size()) {
    for (std::int64_t e = 0; e < half_; ++e) {
      const double frequency = frequencies[static_cast<std::size_t>(e)];
      for (std::int64_t pos = 0; pos < positions; ++pos) {
        const double angle = static_cast<double>(pos) * frequency;
        cos_[static_cast<std::size_t>(pos * half_ + e)] = static_cast<float>(std::cos(angle));
        sin_[static_cast<std::size_t>(pos * half_ + e)] = static_cast<float>(std::sin(angle));
      }
    }
  }

  // Head h of v (rows i < seq_len of every sequence b < batch) turned in place, row i of b by
  // position first(b) + i, in the rotate-half convention: for e < head_dim / 2,
  //   (x_e, x_{e + head_dim/2}) <- (x_e cos - x_{e + head_dim/2} sin, x_{e + head_dim/2} cos + x_e
  //   sin).
  template <class First>
  void rotate(const head_view<float>& v, std::int64_t h, std::int64_t batch, std::int64_t seq_len,
              First first) const noexcept {
    for (std::int64_t b = 0; b < batch; ++b) {
      for (std::int64_t i = 0; i < seq_len; ++i) {
        float* x = v.row(b, h, i);
        const std::size_t at = static_cast<std::size_t>((first(b) + i) * half_);
        const float *c = cos_.data() + at, *s = sin_.data() + at;
        for (std::int64_t e = 0; e < half_; ++e) {
          const float lo = x[e], hi = x[e + half_];
          x[e] = lo * c[e] - hi * s[e];
          x[e + half_] = hi * c[e] + lo * s[e];
        }
      }
    }
  }

 private:
  std::int64_t half_;
  std::vector<float> cos_, sin_;  // positions x half_
};

}  // namespace mha::detail
