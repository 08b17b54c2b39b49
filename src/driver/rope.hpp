// Internal: rotary position embedding (docs/design.md §1.6), shared by every kernel set through
// the driver.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <mutex>
#include <shared_mutex>
#include <vector>

#include "common/attention_args.hpp"

namespace mha::detail {

// cos and sin of pos * f_e for pair e < head_dim / 2, with f the plan's inverse frequencies
// (mha::rope_frequencies: base^(-2e / head_dim), scaled), times the amplitude yarn gives them
// (mha::rope_amplitude, else 1), computed in double and rounded once, so
// every backend turns a head by the same floats (the double oracle computes the angles exactly;
// PyTorch's Llama computes them in float, which differs by up to pos * 2^-24 radians).
//
// The table holds the positions calls have reached, not the plan's whole context: it grows (at
// least doubling, never past `limit`, the context length) when a call needs a later position, so
// a plan whose config allows 2^62 positions costs what its calls use. Memory: 2 * head_dim / 2
// floats per position held, at most twice the largest position a call has reached. Growing
// takes an exclusive lock; rotations hold a shared one, so concurrent runs of a plan only wait
// for a growth they need.
class rope_table {
 public:
  rope_table(std::int64_t limit, std::vector<double> frequencies, double amplitude)
      : limit_(limit),
        half_(static_cast<std::int64_t>(frequencies.size())),
        frequencies_(std::move(frequencies)),
        amplitude_(amplitude) {}

  // Positions [0, end) readable while the returned lock is held; end <= limit (the plan checked
  // the call's positions against its context length).
  std::shared_lock<std::shared_mutex> reach(std::int64_t end) const {
    std::shared_lock<std::shared_mutex> read(mutex_);
    if (end <= positions_) return read;
    read.unlock();
    {
      const std::unique_lock<std::shared_mutex> write(mutex_);
      if (end > positions_) grow(std::max(end, std::min(limit_, 2 * positions_)));
    }
    read.lock();
    return read;
  }

  // Head h of v (rows i < seq_len of every sequence b < batch) turned in place, row i of b by
  // position first(b) + i, in the rotate-half convention: for e < head_dim / 2,
  //   (x_e, x_{e + head_dim/2}) <- (x_e cos - x_{e + head_dim/2} sin, x_{e + head_dim/2} cos +
  //   x_e sin).
  // The caller holds reach(end) for every position it turns by.
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
  // Positions [positions_, end) appended; under the exclusive lock.
  void grow(std::int64_t end) const {
    const std::size_t size = static_cast<std::size_t>(end * half_);
    cos_.resize(size);
    sin_.resize(size);
    for (std::int64_t pos = positions_; pos < end; ++pos) {
      for (std::int64_t e = 0; e < half_; ++e) {
        const double angle = static_cast<double>(pos) * frequencies_[static_cast<std::size_t>(e)];
        cos_[static_cast<std::size_t>(pos * half_ + e)] =
            static_cast<float>(amplitude_ * std::cos(angle));
        sin_[static_cast<std::size_t>(pos * half_ + e)] =
            static_cast<float>(amplitude_ * std::sin(angle));
      }
    }
    positions_ = end;
  }

  std::int64_t limit_, half_;
  std::vector<double> frequencies_;
  double amplitude_;
  mutable std::shared_mutex mutex_;
  mutable std::int64_t positions_ = 0;
  mutable std::vector<float> cos_, sin_;  // positions_ x half_
};

}  // namespace mha::detail
