// Internal: the kernel set, what a backend built on the driver (driver/driver.hpp) supplies: the
// concept the driver's plans are written over, the single-thread execution, and what a set
// declares it computes (driver_support). Below the driver, so that the sets the kernels and the
// backends define (kernels/xsimd_kernel_set.hpp, ...) need not include it.
#pragma once

#include <concepts>
#include <cstdint>

#include "base/checks.hpp"
#include "common/attention_args.hpp"
#include "mha/backend.hpp"

namespace mha::detail {

// A kernel set: what a backend built on the driver supplies. An object the plan owns,
// constructed from the module's config before the weights are packed (so it may keep per-plan
// state: built primitives, the precision); its members are const and safe to call from
// concurrent runs. Stateless sets write them as static members. Each member's contract, one
// fact a line:
template <class K>
concept kernel_set = std::constructible_from<K, const mha::config&> &&
    requires(const K& k, const linear_weights& w, const typename K::packed_linear& p,
             const float* x, std::int64_t rows, float* y, const attention_args& a,
             const run_options& options) {
  // pack: one nn.Linear in the kernels' layout.
  //   reads:    w's weight (out, in) and bias
  //   returns:  the packed_linear linear() takes, owning its storage
  { k.pack(w) } -> std::same_as<typename K::packed_linear>;
  // linear: y = x W^T + b.
  //   reads:    x (rows, in), contiguous row-major; p
  //   writes:   y (rows, out), contiguous row-major
  k.linear(p, x, rows, y);
  // attention: the function of attention_args (common/attention_args.hpp).
  //   reads:    a.q, a.k, a.v (or their bf16 forms), a.mask; with a.cache, the tokens it holds
  //   writes:   a.out (or a.out16); with a.cache, this call's keys and values after each
  //             sequence's held tokens (the lengths are the caller's to advance, after)
  k.attention(a);
  // run and for_each: the set's execution (sequential_execution is the single-thread one).
  //   run:      f() in the execution context `options` asks for (a thread arena, an executor)
  //   for_each: f(i) for every i < n, in any order or concurrently
  k.run(options, [] {});
  k.for_each(rows, [](std::int64_t) {});
};
// Optional members, each declaring what the set computes (driver_support), one a line:
//   project_heads(p, x, batch, seq_len, heads, y) -> std::optional<head_view<const float>>:
//     the projection of x (batch * seq_len rows) into y in a layout the set prefers, seen as
//     (batch, heads, seq_len, out / heads); nullopt, writing nothing, where it has none (the
//     driver then projects with linear() into (rows, out) row-major, seen through strides)
//   static constexpr bool grouped_kv: attention() handles attention_args::kv_group > 1
//   static constexpr bool bf16: the set computes config::precision bf16 (docs/design.md §1.5),
//     rounding packed weights and every product's operands itself
//   cache_head_bytes(capacity, head_dim, kv) -> std::int64_t: decode; the bytes of one
//     (sequence, K/V head) of a cache in the set's layout, attention() then taking
//     attention_args::cache
//   static constexpr bool coded_cache: attention() also reads and appends int8 and k8v4 caches
//   (§1.7)
//   static constexpr bool extensions: attention() computes attention_args' window and softcap
//     (§1.9)

struct sequential_execution {
  template <class F>
  static void run(const run_options&, F&& f) {
    f();
  }
  template <class F>
  static void for_each(std::int64_t n, F&& f) {
    for (std::int64_t i = 0; i < n; ++i) f(i);
  }
};

// What kernel set K declares it computes beyond multi-head attention over a full forward.
template <class K>
inline constexpr bool set_decodes = requires(const K& k, std::int64_t n, mha::precision kv) {
  { k.cache_head_bytes(n, n, kv) } -> std::same_as<std::int64_t>;
};
template <class K>
inline constexpr bool set_caches_codes = requires {
  requires K::coded_cache;
};
template <class K>
inline constexpr bool set_groups_kv = requires {
  requires K::grouped_kv;
};
template <class K>
inline constexpr bool set_computes_bf16 = requires {
  requires K::bf16;
};
template <class K>
inline constexpr bool set_extends = requires {
  requires K::extensions;
};

// backend::supports() of a backend built on kernel set K: what K declares it computes (the
// driver itself gives every set the three formulations, rotary embedding and an out_proj
// without bias).
template <kernel_set K>
support driver_support(const problem& p) {
  return supports_axes(p, {.grouped_kv = set_groups_kv<K>,
                           .decode = set_decodes<K>,
                           .bf16 = set_computes_bf16<K>,
                           .coded_cache = set_caches_codes<K>,
                           .extensions = set_extends<K>});
}

}  // namespace mha::detail
