// mha: the backend interface. A backend turns (config, formulation, weights) into a plan once;
// the plan runs forward passes many times.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "mha/attention.hpp"
#include "mha/config.hpp"
#include "mha/isa.hpp"
#include "mha/kv_cache.hpp"
#include "mha/problem.hpp"
#include "mha/run_options.hpp"
#include "mha/tensor_view.hpp"
#include "mha/weights.hpp"

namespace mha {
// A prepared module: weights split or packed the way one backend wants them, primitives built.
// Immutable after prepare(): run() is const and safe to call from several threads at once.
class plan {
 public:
  virtual ~plan() = default;
  plan(const plan&) = delete;
  plan& operator=(const plan&) = delete;

  // One forward pass. x: (batch, seq_len, d_in), y: (batch, seq_len, d_out), both row-major
  // float32, batch >= 1, 1 <= seq_len <= context_length, x and y not overlapping. y is fully
  // overwritten. Throws mha::invalid_argument (naming the shape or option) before touching y
  // when any of that does not hold; y's contents are unspecified if a backend fails later.
  // Needs scratch of O(batch * seq_len * d_out) floats (plus O(seq_len^2) per head for
  // backends that materialise scores). A plan may keep it for later calls (one set per
  // concurrent caller, sized by the largest call) instead of freeing it before returning.
  void run(tensor_view<const float> x, tensor_view<float> y, const run_options& options = {}) const;

  // Incremental calls (decode; docs/design.md §1.4). make_cache: an empty cache for `batch`
  // sequences of up to `capacity` tokens (1 <= capacity <= context_length), its bytes
  // allocated now (kv_cache::bytes()), keeping keys and values in `kv` (nullopt: the plan's
  // precision; int8, k8v4: §1.7). Throws mha::unsupported when the backend declines decode or that
  // cache (backend::supports with past > 0 and kv_precision kv), mha::invalid_argument on a
  // bad batch, capacity or precision.
  kv_cache make_cache(std::int64_t batch, std::int64_t capacity,
                      std::optional<mha::precision> kv = std::nullopt) const;
  // x (batch, T, d_in) are the next T tokens of each sequence of `cache` (batch == cache's):
  // computes their queries, keys and values, appends the keys and values, and writes y (batch,
  // T, d_out) = rows past_b .. past_b + T - 1 of the forward pass over tokens 0 .. past_b + T - 1
  // of each sequence (causal: of the whole sequence), past_b = cache.length(b) before the call;
  // the lengths then grow by T. Throws
  // mha::invalid_argument, leaving the cache unchanged and y untouched, on what run() rejects,
  // a cache of another plan or batch, or past_b + T > cache.capacity() (naming b and the
  // lengths). Scratch as run() for T tokens; the attention reads the cache in place.
  void run(tensor_view<const float> x, tensor_view<float> y, kv_cache& cache,
           const run_options& options = {}) const;

  const mha::config& config() const noexcept { return config_; }
  mha::formulation formulation() const noexcept { return formulation_; }
  std::string_view backend_name() const noexcept { return backend_name_; }

 protected:
  plan(const mha::config& cfg, mha::formulation form, std::string_view backend_name)
      : config_(cfg), formulation_(form), backend_name_(backend_name) {}

  // Bytes of one (sequence, K/V head) of a cache of `capacity` tokens of precision `kv` in the
  // layout of the plan's kernels; 0 (the default) when the plan keeps no such cache (or runs no
  // incremental calls), and make_cache then throws mha::unsupported.
  virtual std::int64_t cache_head_bytes(std::int64_t capacity, mha::precision kv) const noexcept;
  // Called by run(x, y, cache) once the arguments are validated; appends to the cache's
  // storage and leaves its lengths to run(). The default throws mha::unsupported (a plan that
  // does not decode).
  virtual void execute(tensor_view<const float> x, tensor_view<float> y, kv_cache& cache,
                       const run_options& options) const;
  // K/V heads of a cache: kv_heads() in every formulation (the wrapper computes each K/V
  // group once for its query heads).
  std::int64_t cache_heads() const noexcept;

 private:
  // Called by run() once the arguments are validated.
  virtual void execute(tensor_view<const float> x, tensor_view<float> y,
                       const run_options& options) const = 0;

  mha::config config_;
  mha::formulation formulation_;
  std::string backend_name_;
};

// Whether a backend computes a problem and, when it does not, why ("bf16 precision is not
// implemented"): the answer of backend::supports(), true when the reason is empty.
class support {
 public:
  static support yes() { return support(); }
  static support no(std::string reason) {
    support s;
    s.reason_ = reason.empty() ? "declined" : std::move(reason);
    return s;
  }
  explicit operator bool() const noexcept { return reason_.empty(); }
  const std::string& reason() const noexcept { return reason_; }

 private:
  std::string reason_;
};

// One implementation of the module: "naive", "xsimd", "onednn", "tbb". Backends are stateless
// singletons reached through their accessor (mha::naive_backend(), ...) or the registry; all
// per-module state lives in the plans they prepare.
class backend {
 public:
  virtual ~backend() = default;

  virtual std::string_view name() const noexcept = 0;
  // One line for humans: what it is built on and, for SIMD backends, the ISA in use.
  virtual std::string description() const = 0;
  // The instruction set the backend's kernels dispatch to on this machine, now (after any
  // MHA_XSIMD_ISA or ONEDNN_MAX_CPU_ISA cap): isa::scalar (naive), sse2 ... avx512bf16
  // (xsimd, tbb), the class of oneDNN's effective ISA (onednn; its own name is in
  // description()). Result files record its name, so a figure is read against the peak of the
  // ISA that ran (mha::fma_peak_of, mha::native_bf16).
  virtual mha::isa isa() const = 0;
  // The most threads run() can use on this machine: 1 for single-threaded backends (which
  // ignore run_options::threads), the hardware concurrency for parallel ones.
  virtual int max_threads() const noexcept { return 1; }

  // Whether this backend computes p on this machine (p.cfg must be valid; batch and seq_len do
  // not matter, past > 0 asks about decode). The default computes today's function only:
  // fp32, n_kv_heads == n_heads, past == 0, either formulation; a backend overrides it to
  // accept more or to decline what its dependency cannot do here, naming the reason.
  virtual support supports(const problem& p) const;

  // Validates cfg (mha::invalid_argument naming the bad value), throws mha::unsupported naming
  // the backend and the reason when supports() declines (cfg, form), validates w, then splits
  // or packs the weights and builds whatever the backend needs. Expensive; never inside a timed
  // loop. The plan keeps no reference to w.
  std::unique_ptr<plan> prepare(const config& cfg, formulation form, const weights& w) const;
  // Whether mha::attention (mha/attention.hpp) runs on this backend in `precision` and, when
  // not, why. The default declines, naming the backend.
  virtual support supports_attention(mha::precision precision) const;

 protected:
  backend() = default;

 private:
  // Called by prepare() once cfg and w are validated.
  virtual std::unique_ptr<plan> make_plan(const config& cfg, formulation form,
                                          const weights& w) const = 0;
};

}  // namespace mha
