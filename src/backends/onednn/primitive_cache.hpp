// Internal: the primitives a oneDNN plan keeps: a bounded cache of the most recently used ones
// per kind, keyed by their shape and the OpenMP team size they were built for.
#pragma once

#include <cstddef>
#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <oneapi/dnnl/dnnl.hpp>
#include <string>
#include <utility>
#include <vector>

#include "backends/onednn/attention_plan.hpp"
#include "backends/onednn/primitives.hpp"

namespace mha::detail {

// Values built for one key each, keeping the `capacity` most recently used: get(key, build)
// returns the value held for a key equal to `key`, moved to the front, or builds one with
// build() and inserts it at the front, dropping the least recently used beyond capacity.
// Thread-safe: concurrent callers share values through shared_ptr, so evicting one never pulls
// it from under a caller still using it. build() runs outside the lock (it JIT-compiles
// kernels: other keys keep being served meanwhile); two callers may both build a new key, and
// the first to insert wins: both get its value. If build() throws, nothing is inserted.
template <class Key, class Value, std::size_t capacity>
class primitive_cache {
 public:
  template <class Build>
  std::shared_ptr<const Value> get(const Key& key, Build&& build) const {
    if (auto found = find(key)) return found;
    auto built = std::make_shared<const Value>(build());
    std::lock_guard lock(mutex_);
    for (const auto& [k, v] : recent_) {
      if (k == key) return v;
    }
    recent_.emplace_front(key, std::move(built));
    if (recent_.size() > capacity) recent_.pop_back();
    return recent_.front().second;
  }

  // f(key, value) for every entry, most recently used first.
  template <class F>
  void for_each(F&& f) const {
    std::lock_guard lock(mutex_);
    for (const auto& [k, v] : recent_) f(k, *v);
  }

 private:
  std::shared_ptr<const Value> find(const Key& key) const {
    std::lock_guard lock(mutex_);
    for (auto it = recent_.begin(); it != recent_.end(); ++it) {
      if (it->first == key) {
        recent_.splice(recent_.begin(), recent_, it);  // most recently used first
        return it->second;
      }
    }
    return nullptr;
  }

  mutable std::mutex mutex_;
  mutable std::list<std::pair<Key, std::shared_ptr<const Value>>> recent_;
};

// The keys: a primitive's shape, and `threads`, the team size it was built for (team_size(),
// runtime.hpp: oneDNN fixes a primitive's thread partition when it creates it).
struct linear_key {  // make_linear: rows x (in -> out), with a bias or not
  std::int64_t rows, in, out;
  bool bias;
  int threads;
  bool operator==(const linear_key&) const = default;
};
struct head_split_key {  // make_head_split
  std::int64_t batch, seq_len, heads, head_dim;
  int threads;
  bool operator==(const head_split_key&) const = default;
};
struct attention_key {  // attention_steps
  attention_geometry geometry;
  int threads;
  bool operator==(const attention_key&) const = default;
};
struct to_bf16_key {  // make_to_bf16
  dnnl::memory::dims dims, strides;
  int threads;
  bool operator==(const to_bf16_key&) const = default;
};

// One plan's primitives of every kind, each built on the engine of runtime.hpp the first time
// a caller asks for its shape at the caller's team size, then found. Thread-safe. A oneDNN
// failure while building propagates as dnnl::error (callers name the step).
class primitive_caches {
 public:
  // The projection of `layer` over `rows` rows (make_linear).
  std::shared_ptr<const matmul_step> linear(const packed_linear& layer, std::int64_t rows) const;
  // The head split of (batch, seq_len, heads * head_dim) rows (make_head_split).
  std::shared_ptr<const reorder_step> head_split(std::int64_t batch, std::int64_t seq_len,
                                                 std::int64_t heads, std::int64_t head_dim) const;
  std::shared_ptr<const attention_steps> attention(const attention_geometry& g) const;
  // The reorder rounding an f32 tensor of `dims` read through `strides` to dense bf16
  // (make_to_bf16).
  std::shared_ptr<const reorder_step> to_bf16(const dnnl::memory::dims& dims,
                                              const dnnl::memory::dims& strides) const;

  // "<step> <implementation>" for every primitive held for input shape (batch, seq_len).
  std::vector<std::string> implementations(std::int64_t batch, std::int64_t seq_len) const;
  // The team sizes of the projections held for batch * seq_len rows, most recently used first.
  std::vector<int> team_sizes(std::int64_t batch, std::int64_t seq_len) const;

 private:
  // A plan's projections use two shapes per input shape (Q/K/V and out_proj); the bounds keep
  // a plan that sees many shapes (every T of a generation loop) from holding every shape's
  // kernels and (T, T) masks.
  primitive_cache<linear_key, matmul_step, 16> linear_;
  primitive_cache<head_split_key, reorder_step, 8> head_split_;
  primitive_cache<attention_key, attention_steps, 8> attention_;
  // bf16: x of two projection shapes, a group's Q and its K / V per attention shape.
  primitive_cache<to_bf16_key, reorder_step, 16> to_bf16_;
};

}  // namespace mha::detail
