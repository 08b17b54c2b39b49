// The oneDNN backend: the shared wrapper / split-weight drivers (common/driver.hpp) over a kernel
// set of oneDNN primitives (docs/design.md §2), built on first use of a shape and cached per plan.
#include <omp.h>

#include <algorithm>
#include <cassert>
#include <cmath>
#include <list>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "backends/onednn/introspection.hpp"
#include "backends/onednn/primitives.hpp"
#include "common/driver.hpp"
#include "core/checks.hpp"
#include "core/dropout.hpp"
#include "core/text.hpp"
#include "mha/backends/onednn.hpp"
#include "mha/error.hpp"

namespace mha {
namespace {

using detail::scratch_pool;
using detail::text;

constexpr std::string_view onednn_name = "onednn";

const dnnl::engine& cpu_engine() {
  static const dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  return engine;
}

// The calling thread's stream, made once rather than per primitive call (the wrapper form makes
// 3 projection calls per head).
dnnl::stream& caller_stream() {
  thread_local dnnl::stream stream(cpu_engine());
  return stream;
}

// Runs f(), rethrowing a dnnl::error as mha::error naming the backend and what failed, as
// what() says it (called on failure only): "onednn: oneDNN failed in a (1024 rows)
// projection: could not execute a primitive (dnnl_status_t 5)".
template <class What, class F>
decltype(auto) rethrowing_dnnl_errors(What&& what, F&& f) {
  try {
    return f();
  } catch (const dnnl::error& e) {
    throw error(text(onednn_name, ": oneDNN failed ", what(), ": ", e.what(), " (dnnl_status_t ",
                     static_cast<int>(e.status), ")"));
  }
}

// run_options::threads as the calling thread's OpenMP team size for one run (oneDNN's OpenMP
// runtime reads it when it opens a parallel region), restored afterwards. 0 leaves it alone.
class openmp_threads {
 public:
  explicit openmp_threads(int threads) : previous_(omp_get_max_threads()), set_(threads > 0) {
    if (set_) omp_set_num_threads(threads);
  }
  ~openmp_threads() {
    if (set_) omp_set_num_threads(previous_);
  }
  openmp_threads(const openmp_threads&) = delete;
  openmp_threads& operator=(const openmp_threads&) = delete;

 private:
  int previous_;
  bool set_;
};

// Primitives built for one key (a shape and the OpenMP team size they were created for: oneDNN
// sizes a primitive's work partition by omp_get_max_threads() when it is created and keeps it for
// every execution, so a primitive built for 1 thread would run single-threaded when asked for 2).
// Keeps the `capacity` most recently used. Thread-safe: concurrent runs share entries through
// shared_ptr, so evicting one never pulls it from under a run that is using it.
template <class Key, class Value, std::size_t capacity>
class primitive_cache {
 public:
  template <class Build>
  std::shared_ptr<const Value> get(const Key& key, Build&& build) const {
    if (auto found = find(key)) return found;
    // Built outside the lock (it JIT-compiles kernels): other shapes keep running meanwhile.
    // Two threads may both build a new key; the first to insert wins.
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

struct linear_key {
  std::int64_t rows, in, out;
  bool bias;
  int threads;
  bool operator==(const linear_key&) const = default;
};
struct head_split_key {
  std::int64_t batch, seq_len, heads, head_dim;
  int threads;
  bool operator==(const head_split_key&) const = default;
};
struct attention_key {
  std::int64_t seq_len, head_dim, group;
  bool causal;
  int threads;
  bool operator==(const attention_key&) const = default;
};

// Training mode: row i of slice s of a group's attention weights (group, seq_len, seq_len) times
// the shared dropout mask of (b, h) = where(s), row i (docs/design.md §1.1).
template <class Where>
void apply_dropout(const detail::dropout_spec& dropout, float* weights, std::int64_t group,
                   std::int64_t seq_len, Where where) {
  std::vector<float> multipliers(static_cast<std::size_t>(seq_len));
  for (std::int64_t s = 0; s < group; ++s) {
    const auto [b, h] = where(s);
    for (std::int64_t i = 0; i < seq_len; ++i) {
      detail::dropout_multipliers(dropout, b, h, i, 0, seq_len, multipliers.data());
      float* row = weights + (s * seq_len + i) * seq_len;
      for (std::int64_t j = 0; j < seq_len; ++j) row[j] *= multipliers[j];
    }
  }
}

// A batch element and module-wide head index: the dropout mask's (b, h).
struct batch_head {
  std::int64_t b, h;
};

// How the (b, h) slices of attention_args lie in memory, each a dense (rows, head_dim) matrix,
// back to back: batch-major (slice b * heads + h: the split form's (B, H, T, head_dim)
// projections) or head-major (slice h * batch + b: the wrapper's per-head (B, T, head_dim)
// buffers). The attention primitives read a group of consecutive slices in place.
enum class slice_order { batch_major, head_major, other };

template <class T>
slice_order order_of(const detail::head_view<T>& v, std::int64_t batch, std::int64_t heads,
                     std::int64_t rows, std::int64_t head_dim) {
  const std::int64_t slice = rows * head_dim;
  if (v.row_stride != head_dim) return slice_order::other;
  if ((heads == 1 || v.head_stride == slice) && (batch == 1 || v.batch_stride == heads * slice))
    return slice_order::batch_major;
  if ((batch == 1 || v.batch_stride == slice) && (heads == 1 || v.head_stride == batch * slice))
    return slice_order::head_major;
  return slice_order::other;
}

// The oneDNN primitives as a kernel set of the shared drivers (common/driver.hpp), sequential
// between primitives (each primitive is threaded by oneDNN's OpenMP runtime):
//   linear:        one matmul with fused bias, on weights packed in oneDNN's preferred layout;
//   project_heads: that matmul into a staging buffer, then a reorder into (batch, heads,
//                  seq_len, head_dim), the layout the attention primitives read a group of
//                  heads from;
//   attention:     per group of (b, h) slices, scores (matmul with the scale and the causal
//                  mask fused), softmax in place, weights V (matmul) into a dense buffer, whose
//                  rows are then copied to the output's strided columns (the head merge).
// Primitives are built on first use of their shape and team size and kept per plan; every
// primitive runs on a user scratchpad, taken with the staging, scores and output buffers from
// one lease of the set's scratch pool.
class onednn_kernel_set {
 public:
  using packed_linear = detail::packed_linear;

  packed_linear pack(const linear_weights& w) const {
    return rethrowing_dnnl_errors([&] { return text("packing a (", w.out, ", ", w.in, ") layer"); },
                                  [&] { return detail::pack_linear(cpu_engine(), w); });
  }

  void linear(const packed_linear& w, const float* x, std::int64_t rows, float* y) const {
    rethrowing_dnnl_errors([&] { return text("in a (", rows, " rows) projection"); }, [&] {
      const auto step = linear_step(w, rows);
      scratch_pool::lease scratch(scratch_, floats(detail::scratchpad_bytes(step->pd)));
      dnnl::stream& stream = caller_stream();
      step->run(stream, x, w.weight_data(), w.bias_data(), y, nullptr, bytes(scratch));
      stream.wait();
    });
  }

  // One head is already head-major; more go through the staging buffer and the head split.
  std::optional<detail::head_view<const float>> project_heads(const packed_linear& w,
                                                              const float* x, std::int64_t batch,
                                                              std::int64_t seq_len,
                                                              std::int64_t heads, float* y) const {
    if (heads == 1) return std::nullopt;
    const std::int64_t rows = batch * seq_len, width = w.weights.get_desc().dims()[1];
    const std::int64_t hd = width / heads;
    rethrowing_dnnl_errors([&] { return text("in a (", rows, " rows) head projection"); }, [&] {
      const auto step = linear_step(w, rows);
      const auto split = split_cache_.get(head_split_key{batch, seq_len, heads, hd, team()}, [&] {
        return detail::make_head_split(cpu_engine(), batch, seq_len, heads, hd);
      });
      const std::size_t staging = static_cast<std::size_t>(rows * width);
      const std::size_t pad = floats(std::max(detail::scratchpad_bytes(step->pd),
                                              detail::scratchpad_bytes(split->pd)));
      scratch_pool::lease scratch(scratch_, staging + pad);
      std::byte* scratchpad = bytes(scratch, staging);
      dnnl::stream& stream = caller_stream();
      step->run(stream, x, w.weight_data(), w.bias_data(), scratch.data(), nullptr, scratchpad);
      split->run(stream, scratch.data(), y, scratchpad);
      stream.wait();
    });
    return detail::head_view<const float>{y, heads * seq_len * hd, seq_len * hd, hd};
  }

  // q, k and v must share one slice order (project_heads' and the wrapper's buffers do); out
  // may be any head_view.
  void attention(const detail::attention_args& a) const {
    assert(a.kv_group == 1 && a.past == 0);  // declined: grouped K/V, decode (backend::supports)
    const slice_order order = order_of(a.q, a.batch, a.heads, a.seq_len, a.head_dim);
    assert(order != slice_order::other &&
           order == order_of(a.k, a.batch, a.heads, a.seq_len, a.head_dim) &&
           order == order_of(a.v, a.batch, a.heads, a.seq_len, a.head_dim));
    // The scores of a group of heads (at least one T x T slice) and the causal mask (T x T).
    detail::check_score_memory("onednn", a.seq_len, a.seq_len, a.causal ? 2 : 1);
    rethrowing_dnnl_errors([&] { return text("in attention over ", a.seq_len, " tokens"); }, [&] {
      const std::int64_t count = a.batch * a.heads, t = a.seq_len, hd = a.head_dim;
      const std::int64_t group = detail::attention_group(count, t);
      const auto steps = attention_cache_.get(attention_key{t, hd, group, a.causal, team()}, [&] {
        return detail::attention_steps(cpu_engine(), t, hd, group, a.causal, a.scale);
      });
      const std::size_t scores = steps->score_floats(), out = static_cast<std::size_t>(group * t * hd);
      scratch_pool::lease scratch(scratch_, scores + out + floats(steps->scratchpad_bytes()));
      const group_buffers buf{scratch.data(), scratch.data() + scores,
                              bytes(scratch, scores + out)};
      dnnl::stream& stream = caller_stream();
      const std::int64_t slice = t * hd;
      // Slice s as (b, h) of a.
      auto where = [&](std::int64_t s) {
        return order == slice_order::batch_major ? batch_head{s / a.heads, s % a.heads}
                                                 : batch_head{s % a.batch, s / a.batch};
      };
      for (std::int64_t first = 0; first < count; first += group) {
        auto between = [&](float* weights) {
          if (!a.dropout.active()) return;
          apply_dropout(a.dropout, weights, group, t, [&](std::int64_t i) {
            const batch_head bh = where(first + i);
            return batch_head{bh.b, a.first_head + bh.h};
          });
        };
        const std::int64_t at = first * slice;
        steps->run_group(stream, a.q.data + at, a.k.data + at, a.v.data + at, buf.out, buf.scores,
                         buf.scratchpad, between);
        stream.wait();
        if (a.causal) {
          keep_causal_rows_finite(*steps, stream, buf, a.k.data + at, a.v.data + at,
                                  a.q.data + at, hd, between);
        }
        // The head merge: each slice's rows into its columns of the output.
        for (std::int64_t s = 0; s < group; ++s) {
          const batch_head bh = where(first + s);
          for (std::int64_t i = 0; i < t; ++i)
            std::copy_n(buf.out + (s * t + i) * hd, hd, a.out.row(bh.b, bh.h, i));
        }
      }
    });
  }

  // run_options::threads as the calling thread's OpenMP team size for the run.
  template <class F>
  void run(const run_options& options, F&& f) const {
    const openmp_threads threads(options.threads);
    f();
  }
  template <class F>
  static void for_each(std::int64_t n, F&& f) {
    for (std::int64_t i = 0; i < n; ++i) f(i);
  }

  // "<step> <implementation>" for every primitive built for input shape (batch, seq_len).
  std::vector<std::string> implementations(std::int64_t batch, std::int64_t seq_len) const {
    std::vector<std::string> out;
    linear_cache_.for_each([&](const linear_key& k, const detail::matmul_step& step) {
      if (k.rows == batch * seq_len) out.push_back(detail::describe("projection", step.pd));
    });
    split_cache_.for_each([&](const head_split_key& k, const detail::reorder_step& step) {
      if (k.batch == batch && k.seq_len == seq_len)
        out.push_back(detail::describe("head_split", step.pd));
    });
    attention_cache_.for_each([&](const attention_key& k, const detail::attention_steps& steps) {
      if (k.seq_len == seq_len) steps.describe(out);
    });
    return out;
  }

  // The team sizes of the projections built for batch * seq_len rows, most recently used first.
  std::vector<int> team_sizes(std::int64_t batch, std::int64_t seq_len) const {
    std::vector<int> out;
    linear_cache_.for_each([&](const linear_key& k, const detail::matmul_step&) {
      if (k.rows == batch * seq_len && std::ranges::find(out, k.threads) == out.end())
        out.push_back(k.threads);
    });
    return out;
  }

 private:
  struct group_buffers {
    float *scores, *out;
    std::byte* scratchpad;
  };

  static int team() { return omp_get_max_threads(); }
  static std::size_t floats(std::size_t bytes) { return (bytes + sizeof(float) - 1) / sizeof(float); }
  static std::byte* bytes(scratch_pool::lease& scratch, std::size_t offset = 0) {
    return reinterpret_cast<std::byte*>(scratch.data() + offset);
  }

  std::shared_ptr<const detail::matmul_step> linear_step(const packed_linear& w,
                                                         std::int64_t rows) const {
    const dnnl::memory::dims dims = w.weights.get_desc().dims();
    return linear_cache_.get(linear_key{rows, dims[0], dims[1], w.bias_data() != nullptr, team()},
                             [&] { return detail::make_linear(cpu_engine(), rows, w); });
  }

  // The dense products multiply masked weights (0) by every key and value, and a masked score
  // is computed before the mask is added: a NaN or Inf in token j's K or V would reach the rows
  // before j (0 * NaN, NaN + -inf). When a slice of the group has one, its rows before the first
  // such token are recomputed from K and V with the non-finite values replaced by 0, which those
  // rows never see: their outputs are then exactly those of the same input without the NaN.
  template <class Between>
  void keep_causal_rows_finite(const detail::attention_steps& steps, dnnl::stream& stream,
                               const group_buffers& buf, const float* k, const float* v,
                               const float* q, std::int64_t hd, Between& between) const {
    const std::int64_t group = steps.group(), t = steps.seq_len(), slice = t * hd;
    std::vector<std::int64_t> first_bad(static_cast<std::size_t>(group), t);
    bool any = false;
    for (std::int64_t g = 0; g < group; ++g) {
      for (std::int64_t e = 0; e < slice; ++e) {
        if (!std::isfinite(k[g * slice + e]) || !std::isfinite(v[g * slice + e])) {
          first_bad[static_cast<std::size_t>(g)] = e / hd;
          any = true;
          break;
        }
      }
    }
    if (!any) return;
    const auto n = static_cast<std::size_t>(group * slice);
    std::vector<float> clean_k(k, k + n), clean_v(v, v + n), rows(n);
    for (float& e : clean_k) e = std::isfinite(e) ? e : 0.0f;
    for (float& e : clean_v) e = std::isfinite(e) ? e : 0.0f;
    steps.run_group(stream, q, clean_k.data(), clean_v.data(), rows.data(), buf.scores,
                    buf.scratchpad, between);
    stream.wait();
    for (std::int64_t g = 0; g < group; ++g) {
      const std::int64_t keep = first_bad[static_cast<std::size_t>(g)] * hd;
      std::copy_n(rows.data() + g * slice, keep, buf.out + g * slice);
    }
  }

  // A plan's projections use two shapes per input shape (Q/K/V and out_proj); the bounds keep
  // a plan that sees many shapes (every T of a generation loop) from holding every shape's
  // kernels and (T, T) masks.
  primitive_cache<linear_key, detail::matmul_step, 16> linear_cache_;
  primitive_cache<head_split_key, detail::reorder_step, 8> split_cache_;
  primitive_cache<attention_key, detail::attention_steps, 8> attention_cache_;
  scratch_pool scratch_;
};

using onednn_plan = detail::driver_plan<onednn_kernel_set>;

// The ISA oneDNN's kernels run on (dnnl::get_effective_cpu_isa()), in oneDNN's spelling.
std::string_view isa_name(dnnl::cpu_isa isa) {
  using enum dnnl::cpu_isa;
  static constexpr std::pair<dnnl::cpu_isa, std::string_view> names[] = {
      {sse41, "sse41"},
      {avx, "avx"},
      {avx2, "avx2"},
      {avx2_vnni, "avx2_vnni"},
      {avx512_mic, "avx512_mic"},
      {avx512_mic_4ops, "avx512_mic_4ops"},
      {avx512_core, "avx512_core"},
      {avx512_core_vnni, "avx512_core_vnni"},
      {avx512_core_bf16, "avx512_core_bf16"},
      {avx512_core_amx, "avx512_core_amx"}};
  for (const auto& [value, name] : names) {
    if (value == isa) return name;
  }
  return "unknown ISA";
}

// dnnl::version()->cpu_runtime as a word.
std::string_view runtime_name(unsigned runtime) {
  switch (runtime) {
    case DNNL_RUNTIME_OMP:
      return "OpenMP";
    case DNNL_RUNTIME_TBB:
      return "TBB";
    case DNNL_RUNTIME_SEQ:
      return "sequential";
    default:
      return "unknown";
  }
}

struct onednn_impl final : backend {
  std::string_view name() const noexcept override { return onednn_name; }
  std::string description() const override {
    const dnnl::version_t* v = dnnl::version();
    return text("oneDNN ", v->major, ".", v->minor, ".", v->patch, " (",
                runtime_name(v->cpu_runtime), " runtime), ",
                isa_name(dnnl::get_effective_cpu_isa()), ", fp32");
  }
  std::string isa() const override { return std::string(isa_name(dnnl::get_effective_cpu_isa())); }
  int max_threads() const noexcept override { return omp_get_max_threads(); }

 private:
  std::unique_ptr<plan> make_plan(const config& cfg, formulation form,
                                  const weights& w) const override {
    return std::make_unique<onednn_plan>(cfg, form, w, name());
  }
};

}  // namespace

const backend& onednn_backend() {
  static const onednn_impl instance;
  return instance;
}

bool onednn_thread_count_bitwise() {
  using enum dnnl::cpu_isa;
  switch (dnnl::get_effective_cpu_isa()) {
    case avx512_core:
    case avx512_core_vnni:
    case avx512_core_bf16:
    case avx512_core_amx:
      return true;
    default:
      return false;
  }
}

namespace {

// p as the oneDNN plan it must be, with (batch, seq_len) in its range; `caller` names the
// introspection function in the errors.
const onednn_plan& introspected(std::string_view caller, const plan& p, std::int64_t batch,
                                std::int64_t seq_len) {
  const auto* own = dynamic_cast<const onednn_plan*>(&p);
  if (own == nullptr) {
    throw invalid_argument(
        text(caller, ": the plan is from backend '", p.backend_name(), "', expected onednn"));
  }
  if (batch < 1 || seq_len < 1 || seq_len > p.config().context_length) {
    throw invalid_argument(
        text(caller, ": shape (batch ", batch, ", seq_len ", seq_len,
             ") needs batch >= 1 and 1 <= seq_len <= ", p.config().context_length));
  }
  return *own;
}

}  // namespace

std::vector<std::string> detail::onednn_implementations(const plan& p, std::int64_t batch,
                                                        std::int64_t seq_len) {
  const onednn_plan& own = introspected("onednn_implementations", p, batch, seq_len);
  // A run on zeros builds (or finds) every primitive of the shape at the caller's team size.
  const std::vector<float> x(static_cast<std::size_t>(batch * seq_len * p.config().d_in));
  std::vector<float> y(static_cast<std::size_t>(batch * seq_len * p.config().d_out));
  p.run({x.data(), batch, seq_len, p.config().d_in}, {y.data(), batch, seq_len, p.config().d_out});
  return own.kernels().implementations(batch, seq_len);
}

std::vector<int> detail::onednn_cached_team_sizes(const plan& p, std::int64_t batch,
                                                  std::int64_t seq_len) {
  return introspected("onednn_cached_team_sizes", p, batch, seq_len)
      .kernels()
      .team_sizes(batch, seq_len);
}

}  // namespace mha
