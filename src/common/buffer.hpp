// Internal: uninitialised, 64-byte aligned float storage for per-call scratch and packed weights.
#pragma once

#include <cstddef>
#include <memory>
#include <new>

namespace mha::detail {

// An owning array of `size` floats, 64-byte aligned (one cache line, one AVX-512 register), and
// left uninitialised: scratch is always fully written before it is read, so zeroing it would be
// wasted bandwidth.
class float_buffer {
 public:
  float_buffer() = default;
  explicit float_buffer(std::size_t size)
      : data_(static_cast<float*>(::operator new(size * sizeof(float), alignment))), size_(size) {}

  float* data() noexcept { return data_.get(); }
  const float* data() const noexcept { return data_.get(); }
  std::size_t size() const noexcept { return size_; }

 private:
  static constexpr std::align_val_t alignment{64};
  struct deleter {
    void operator()(float* p) const noexcept { ::operator delete(p, alignment); }
  };
  std::unique_ptr<float, deleter> data_;
  std::size_t size_ = 0;
};

}  // namespace mha::detail
