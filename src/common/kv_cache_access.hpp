// Internal: the drivers' view of a kv_cache's storage (mha/kv_cache.hpp states the layout).
#pragma once

#include <cstdint>

#include "common/attention_args.hpp"
#include "mha/kv_cache.hpp"

namespace mha::detail {

struct kv_cache_access {
  // Keys and values of every (sequence, head): capacity rows of head_dim each, a head's keys
  // followed by its values.
  static head_view<float> keys(kv_cache& c) noexcept {
    const std::int64_t head = 2 * c.capacity_ * c.head_dim_;
    return {c.data_.get(), c.heads_ * head, head, c.head_dim_};
  }
  static head_view<float> values(kv_cache& c) noexcept {
    head_view<float> v = keys(c);
    v.data += c.capacity_ * c.head_dim_;
    return v;
  }
};

}  // namespace mha::detail
