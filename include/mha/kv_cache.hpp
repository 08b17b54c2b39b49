// mha: a KV cache, the keys and values of the tokens each sequence of a batch has seen, for
// incremental (decode) calls of a plan (docs/design.md §1.4).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

#include "mha/config.hpp"
#include "mha/isa.hpp"

namespace mha {

class backend;
class plan;
namespace detail {
struct kv_cache_access;
}

// Made empty by plan::make_cache(batch, capacity[, precision]) for that plan, whose run(x, y,
// cache) appends each call's keys and values, in the cache's precision (docs/design.md §1.7); or
// by mha::make_attention_cache for a backend's attention calls over it (mha/attention.hpp: a
// model that projects its own queries, keys and values).
// Holds, per sequence b < batch(), the keys and values of its length(b) tokens so far, for every
// K/V head of the plan (config::kv_heads(), in every formulation: the wrapper computes each K/V
// group once for its query heads), in the layout the plan's kernels read (opaque; docs/design.md
// §1.4 describes each backend's).
//
// A cache belongs to the plan (or the backend's attention calls) that made it: a call with
// another's cache throws. One caller
// at a time: a run, reset or truncate holds the cache for its duration, and a second one that
// starts meanwhile (on another thread) throws mha::invalid_argument naming the concurrent use and
// changes nothing, so that nothing is ever written past the capacity; concurrent runs need one
// cache each (they may share the plan). Reading lengths() while a run holds it is a data race.
// Movable (not while held); copied only on purpose, by copy().
// A sliding window's ring (make_attention_cache with a window shorter than the capacity): the
// last ring_slots(window) tokens of each sequence, key j at slot j mod slots. A call appends
// first and then reads each query's window, so the ring has room for a call of ring_chunk
// tokens beyond the window (and a key step's rounding, 64 keys at most): longer calls are taken
// ring_chunk tokens at a time.
inline constexpr std::int64_t ring_chunk = 256;
constexpr std::int64_t ring_slots(std::int64_t window) noexcept {
  return (window + ring_chunk + 64 + 63) / 64 * 64;
}

class kv_cache {
 public:
  kv_cache(kv_cache&&) noexcept = default;
  kv_cache& operator=(kv_cache&&) noexcept = default;

  std::int64_t batch() const noexcept { return static_cast<std::int64_t>(lengths_.size()); }
  // Tokens each sequence may hold: at most the plan's context_length.
  std::int64_t capacity() const noexcept { return capacity_; }
  // An attention cache's sliding window (make_attention_cache; 0: none): every call over it
  // attends over each query's last window keys (docs/design.md §1.9).
  std::int64_t window() const noexcept { return window_; }
  // Tokens its storage holds per sequence: the capacity; with a window shorter than the capacity,
  // fewer: a ring of the last ring_slots(window) tokens (docs/design.md §1.9), whatever the
  // capacity, so that a sliding layer's cache costs its window, not the context.
  std::int64_t slots() const noexcept { return slots_; }
  // Tokens sequence b holds (0 <= b < batch(), else mha::invalid_argument).
  std::int64_t length(std::int64_t b) const;
  // K/V heads per sequence.
  std::int64_t heads() const noexcept { return heads_; }
  const std::vector<std::int64_t>& lengths() const noexcept { return lengths_; }
  // The format its keys and values are kept in: fp32, bf16, int8 (codes, with a scale and an
  // offset per token and K/V head) or k8v4 (int8's keys; values as 4-bit codes with a scale and
  // an offset per group of 32 elements).
  mha::precision precision() const noexcept { return precision_; }
  // The storage, allocated (and zeroed) once when the cache is made: 2 * batch * capacity *
  // heads * (head_dim * the element's bytes: 4 for fp32, 2 for bf16, 1 for int8; int8 adds 4
  // bytes of scale and zero per row; k8v4 keys as int8's, values half a byte an element and 4
  // bytes per group of 32), plus the padding of the backend's layout (the SIMD backends round
  // head_dim up to their panel width, e.g. 17 to 24) and head_dim key channel scales per head.
  std::size_t bytes() const noexcept { return static_cast<std::size_t>(bytes_); }

  // Forgets every sequence (lengths 0); the storage stays.
  void reset();
  // Forgets sequence b (0 <= b < batch(), else mha::invalid_argument): continuous batching
  // starts a new sequence in a finished one's slot.
  void reset(std::int64_t b);
  // Keeps the first `length` tokens of sequence b and forgets the rest (0 <= b < batch() and
  // 0 <= length <= length(b), else mha::invalid_argument naming them): a rollback, of the
  // tokens speculative decoding rejected or of a benchmark's step. The kept tokens' keys and
  // values are unchanged (a rotary embedding is applied by absolute position when stored). A
  // ring (slots() < capacity()) rolls back at most ring_chunk tokens: the keys a query after a
  // deeper rollback sees have left it (refused naming both).
  void truncate(std::int64_t b, std::int64_t length);
  // A new cache holding the same tokens, for the same plan (or backend's attention calls): a
  // prompt's cache copied once per continuation. Its storage is allocated and copied now (the
  // whole capacity); held by the copy as a call holds the cache (a concurrent call throws).
  kv_cache copy() const;

  // An attention cache's (make_attention_cache; a plan's cache has none): the backend and ISA
  // whose kernels' layout it holds, head_dim and the attention's precision (fp32 or bf16).
  struct attention_owner {
    const mha::backend* made_by = nullptr;
    mha::isa isa = mha::isa::scalar;
    std::int64_t head_dim = 0;
    mha::precision precision = mha::precision::fp32;
  };

 private:
  friend class plan;
  friend struct detail::kv_cache_access;
  // head_bytes: the bytes of one (sequence, head) in the plan's layout.
  kv_cache(const plan* owner, mha::precision precision, std::int64_t batch, std::int64_t capacity,
           std::int64_t heads, std::int64_t head_bytes);

  struct aligned_delete {
    std::size_t alignment;  // the storage's, as allocated
    void operator()(std::byte* p) const noexcept;
  };

  // Set while a call holds the cache (claim, in plan.cpp): the lengths, and the storage past
  // them, change only under it. A moved cache is not held.
  struct use_flag {
    std::atomic<bool> held{false};
    use_flag() = default;
    use_flag(use_flag&&) noexcept {}
    use_flag& operator=(use_flag&&) noexcept { return *this; }
  };
  // Holds the cache for one call: taken atomically, so of two calls that start together one
  // holds it and the other throws (mha::invalid_argument naming `where` and the concurrent use)
  // before either reads a length.
  class claim {
   public:
    claim(const kv_cache& cache, std::string_view where);
    ~claim();
    claim(const claim&) = delete;
    claim& operator=(const claim&) = delete;

   private:
    const kv_cache& cache_;
  };

  const plan* owner_;  // nullptr for an attention cache
  attention_owner attention_;
  mha::precision precision_;
  std::int64_t capacity_, heads_, head_bytes_, bytes_;
  std::int64_t window_ = 0, slots_;  // slots_: capacity_, or a ring's (make_attention_cache)
  std::vector<std::int64_t> lengths_;
  mutable use_flag in_use_;
  // Raw storage (64-byte aligned; a storage of 2 MiB or more 2 MiB-aligned, on huge pages where
  // Linux grants them) in which each kernel set keeps elements of its own type.
  std::unique_ptr<std::byte[], aligned_delete> data_;
};

}  // namespace mha
