// Internal: what a backend that runs mha::attention implements beside mha::backend, whose public
// interface names no internal type: the kernel call over validated arguments, and the bytes of
// its cache. A backend class derives from both (xsimd, tbb, naive); mha::attention and
// mha::make_attention_cache find it with dynamic_cast (detail::attend, src/core/attention.cpp).
#pragma once

#include <cstdint>

#include "common/attention_args.hpp"
#include "mha/backend.hpp"

namespace mha::detail {

class attention_calls {
 public:
  virtual ~attention_calls() = default;
  // mha::attention's kernel call, once it has validated its arguments and cut them into calls
  // whose query rows stand at the end of their keys (bf16 set there, bf16 operands in q16, k16
  // and v16). Only called when the backend's supports_attention accepted the precision.
  virtual void attend(const attention_args& args, const run_options& options) const = 0;
  // Bytes of one (sequence, K/V head) of an attention cache (mha::make_attention_cache) of
  // `capacity` tokens of head_dim, kept in `kv` and computed in `compute`, in the layout attend()
  // reads: the layout of its kernels now (isa()). 0 where attend() takes no cache.
  virtual std::int64_t attention_cache_head_bytes(std::int64_t capacity, std::int64_t head_dim,
                                                  precision kv,
                                                  precision compute) const noexcept = 0;
};

// `backend`'s attend; mha::unsupported naming it where it has no attention_calls.
void attend(const backend& backend, const attention_args& args, const run_options& options);
// `backend`'s attention_cache_head_bytes; 0 where it has no attention_calls.
std::int64_t attention_cache_head_bytes(const backend& backend, std::int64_t capacity,
                                        std::int64_t head_dim, precision kv, precision compute);

}  // namespace mha::detail
