// Internal: uninitialised, 64-byte aligned float storage for per-call scratch and packed weights.
#pragma once

#include <cstddef>
#include <memory>
#include <mutex>
#include <new>
#include <utility>
#include <vector>

namespace mha::detail {

// An owning array of `size` elements of T (a trivial type: float, or the 16- and 32-bit words of
// bf16 data), 64-byte aligned (one cache line, one AVX-512 register), and left uninitialised:
// scratch is always fully written before it is read, so zeroing it would be wasted bandwidth.
template <class T>
class aligned_buffer {
 public:
  aligned_buffer() = default;
  explicit aligned_buffer(std::size_t size)
      : data_(static_cast<T*>(::operator new(size * sizeof(T), alignment))), size_(size) {}

  T* data() noexcept { return data_.get(); }
  const T* data() const noexcept { return data_.get(); }
  std::size_t size() const noexcept { return size_; }

 private:
  static constexpr std::align_val_t alignment{64};
  struct deleter {
    void operator()(T* p) const noexcept { ::operator delete(p, alignment); }
  };
  std::unique_ptr<T, deleter> data_;
  std::size_t size_ = 0;
};
using float_buffer = aligned_buffer<float>;

// Scratch buffers a const, thread-safe object (a plan) reuses across calls. Each concurrent
// caller leases a buffer no one else holds; it returns to the pool when the lease ends. The
// pool keeps one buffer per concurrent caller, as large as the largest request, for the
// owner's lifetime, so repeated runs touch pages that are already mapped (glibc returns freed
// multi-MB blocks to the kernel, and fresh per-call buffers fault every page in again).
template <class T>
class scratch_pool_of {
 public:
  // A buffer of at least `size` elements for its holder alone. Throws std::bad_alloc.
  class lease {
   public:
    lease(const scratch_pool_of& pool, std::size_t size) : pool_(pool), buffer_(pool.take()) {
      if (buffer_.size() >= size) return;
      try {
        buffer_ = aligned_buffer<T>(size);
      } catch (...) {
        pool_.give_back(std::move(buffer_));
        throw;
      }
    }
    lease(const lease&) = delete;
    lease& operator=(const lease&) = delete;
    ~lease() { pool_.give_back(std::move(buffer_)); }

    T* data() noexcept { return buffer_.data(); }

   private:
    const scratch_pool_of& pool_;
    aligned_buffer<T> buffer_;
  };

 private:
  // Invariant: free_.capacity() >= free_.size() + leased_, so give_back() never allocates.
  aligned_buffer<T> take() const {
    const std::lock_guard<std::mutex> lock(mutex_);
    free_.reserve(free_.size() + leased_ + 1);
    ++leased_;
    if (free_.empty()) return {};
    aligned_buffer<T> buffer = std::move(free_.back());
    free_.pop_back();
    return buffer;
  }
  void give_back(aligned_buffer<T> buffer) const noexcept {
    const std::lock_guard<std::mutex> lock(mutex_);
    --leased_;
    free_.push_back(std::move(buffer));
  }

  mutable std::mutex mutex_;
  mutable std::vector<aligned_buffer<T>> free_;
  mutable std::size_t leased_ = 0;
};

using scratch_pool = scratch_pool_of<float>;

}  // namespace mha::detail
