// The oneDNN backend: both formulations as sequences of oneDNN primitives (docs/design.md §2), built once
// per input shape and cached in the plan.
#include <omp.h>

#include <array>
#include <cmath>
#include <list>
#include <memory>
#include <mutex>
#include <optional>

#include "backends/onednn/introspection.hpp"
#include "backends/onednn/primitives.hpp"
#include "core/checks.hpp"
#include "common/buffer.hpp"
#include "core/dropout.hpp"
#include "core/text.hpp"
#include "mha/backends/onednn.hpp"
#include "mha/error.hpp"
#include "mha/problem.hpp"

namespace mha {
namespace {

using detail::attention_steps;
using detail::float_buffer;
using detail::matmul_step;
using detail::packed_linear;
using detail::reorder_step;
using detail::text;

constexpr std::string_view onednn_name = "onednn";

const dnnl::engine& cpu_engine() {
  static const dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  return engine;
}

// Runs f(), rethrowing a dnnl::error as mha::error naming the backend and what failed, as
// what() says it (called on failure only): "onednn: oneDNN failed running
// split_weight/b4/t256/din768/dout768/h12: could not execute a primitive (dnnl_status_t 5)".
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

// The primitives of one input shape (batch, seq_len) of one plan, for one OpenMP team size:
// oneDNN sizes a primitive's work partition by omp_get_max_threads() when it is created and keeps
// it for every execution (its own primitive cache keys on the thread count for the same reason),
// so a primitive built for 1 thread would run single-threaded when asked for 2.
//   split_weight: x -> projection (d_out wide) -> head split, for Q, K, V; attention over the
//                 batch * heads dense slices; head merge; out_proj.
//   wrapper:      per head, x -> projection (head_dim wide) for Q, K, V into the head's own
//                 buffers; attention over its batch slices, into its block of a heads-outer
//                 buffer; after the last head, head merge (the concatenation); out_proj.
// With one head the split and merge are identities and are left out.
struct shape_steps {
  // `projected` is any of the plan's Q/K/V layers (they share shape, layout and bias presence),
  // `out` its out_proj layer or null.
  shape_steps(const dnnl::engine& engine, const config& cfg, formulation form, std::int64_t b,
              std::int64_t t, const packed_linear& projected, const packed_linear* out)
      : batch(b),
        seq_len(t),
        threads(omp_get_max_threads()),
        projection(detail::make_linear(engine, b * t, projected)),
        attention(
            engine, t, cfg.head_dim(),
            detail::attention_group(form == formulation::split_weight ? b * cfg.n_heads : b, t),
            cfg.causal, 1.0f / std::sqrt(static_cast<float>(cfg.head_dim()))) {
    const std::int64_t h = cfg.n_heads, hd = cfg.head_dim();
    if (h > 1) {
      if (form == formulation::split_weight) {
        head_split.emplace(detail::make_head_split(engine, b, t, h, hd));
      }
      head_merge.emplace(detail::make_head_merge(engine,
                                                 form == formulation::split_weight
                                                     ? detail::head_major::batch_outer
                                                     : detail::head_major::heads_outer,
                                                 b, t, h, hd));
    }
    if (out != nullptr) out_proj.emplace(detail::make_linear(engine, b * t, *out));
    scratchpad_bytes =
        std::max({detail::scratchpad_bytes(projection.pd), attention.scratchpad_bytes(),
                  scratchpad_of(head_split), scratchpad_of(head_merge), scratchpad_of(out_proj)});
  }

  std::vector<std::string> describe() const {
    std::vector<std::string> out = {detail::describe("projection", projection.pd)};
    if (head_split) out.push_back(detail::describe("head_split", head_split->pd));
    attention.describe(out);
    if (head_merge) out.push_back(detail::describe("head_merge", head_merge->pd));
    if (out_proj) out.push_back(detail::describe("out_proj", out_proj->pd));
    return out;
  }

  std::int64_t batch, seq_len;
  int threads;             // the OpenMP team size the primitives were created for
  matmul_step projection;  // x -> Q, K or V: all heads (split_weight) or one head (wrapper)
  std::optional<reorder_step> head_split;
  attention_steps attention;
  std::optional<reorder_step> head_merge;
  std::optional<matmul_step> out_proj;
  std::size_t scratchpad_bytes = 0;  // the most any step needs; steps run one after another

 private:
  template <class Step>
  static std::size_t scratchpad_of(const std::optional<Step>& step) {
    return step ? detail::scratchpad_bytes(step->pd) : 0;
  }
};

// The steps of the most recently run (shape, team size) pairs. Thread-safe: concurrent runs share
// entries through shared_ptr, so evicting one never pulls it from under a run that is using it.
class step_cache {
 public:
  template <class Build>
  std::shared_ptr<const shape_steps> get(std::int64_t batch, std::int64_t seq_len, int threads,
                                         Build&& build) const {
    if (auto found = find(batch, seq_len, threads)) return found;
    // Built outside the lock (it JIT-compiles kernels): other shapes keep running meanwhile.
    // Two threads may both build a new shape; the first to insert wins.
    std::shared_ptr<const shape_steps> built = build();
    std::lock_guard lock(mutex_);
    for (const auto& entry : recent_) {
      if (matches(*entry, batch, seq_len, threads)) return entry;
    }
    recent_.push_front(std::move(built));
    if (recent_.size() > capacity) recent_.pop_back();
    return recent_.front();
  }

  // The team sizes cached for (batch, seq_len), most recently used first.
  std::vector<int> team_sizes(std::int64_t batch, std::int64_t seq_len) const {
    std::lock_guard lock(mutex_);
    std::vector<int> out;
    for (const auto& entry : recent_) {
      if (entry->batch == batch && entry->seq_len == seq_len) out.push_back(entry->threads);
    }
    return out;
  }

 private:
  // A plan usually serves one or a few shapes; the bound keeps one that sees many (every T of a
  // generation loop) from holding every shape's kernels and (T, T) masks.
  static constexpr std::size_t capacity = 8;

  static bool matches(const shape_steps& s, std::int64_t batch, std::int64_t seq_len, int threads) {
    return s.batch == batch && s.seq_len == seq_len && s.threads == threads;
  }

  std::shared_ptr<const shape_steps> find(std::int64_t batch, std::int64_t seq_len,
                                          int threads) const {
    std::lock_guard lock(mutex_);
    for (auto it = recent_.begin(); it != recent_.end(); ++it) {
      if (matches(**it, batch, seq_len, threads)) {
        recent_.splice(recent_.begin(), recent_, it);  // most recently used first
        return recent_.front();
      }
    }
    return nullptr;
  }

  mutable std::mutex mutex_;
  mutable std::list<std::shared_ptr<const shape_steps>> recent_;
};

// The buffers of one run, carved from a single allocation.
struct call_buffers {
  enum piece { scratchpad, staging, q, k, v, heads_out, context, scores, piece_count };

  // sizes[p]: floats of piece p (0 when unused). Each piece starts on a 64-byte boundary.
  explicit call_buffers(const std::array<std::size_t, piece_count>& sizes) {
    constexpr std::size_t line = 64 / sizeof(float);
    std::array<std::size_t, piece_count> offset{};
    std::size_t total = 0;
    for (std::size_t p = 0; p < piece_count; ++p) {
      offset[p] = total;
      total += (sizes[p] + line - 1) / line * line;
    }
    storage = float_buffer(total);
    for (std::size_t p = 0; p < piece_count; ++p) at[p] = storage.data() + offset[p];
  }

  float* operator[](piece p) const noexcept { return at[p]; }
  std::byte* scratchpad_bytes() const noexcept {
    return reinterpret_cast<std::byte*>(at[scratchpad]);
  }

  float_buffer storage;
  std::array<float*, piece_count> at{};
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

// Q, K and V projections: of all heads (split_weight) or of one head (wrapper).
struct qkv {
  packed_linear query, key, value;
};

qkv pack_qkv(const linear_weights& query, const linear_weights& key, const linear_weights& value) {
  const dnnl::engine& e = cpu_engine();
  return {detail::pack_linear(e, query), detail::pack_linear(e, key),
          detail::pack_linear(e, value)};
}

class onednn_plan final : public plan {
 public:
  onednn_plan(const mha::config& cfg, mha::formulation form, const weights& w)
      : plan(cfg, form, onednn_name) {
    rethrowing_dnnl_errors([&] { return text("packing the weights of ", to_string(cfg)); },
                           [&] { pack(w); });
  }

  std::vector<std::string> implementations(std::int64_t batch, std::int64_t seq_len) const {
    return steps(batch, seq_len)->describe();
  }

  std::vector<int> cached_team_sizes(std::int64_t batch, std::int64_t seq_len) const {
    return cache_.team_sizes(batch, seq_len);
  }

 private:
  using piece = call_buffers::piece;

  void pack(const weights& w) {
    const mha::config& cfg = config();
    if (formulation() == mha::formulation::split_weight) {
      qkv_.push_back(pack_qkv(w.query, w.key, w.value));
    } else {
      // The wrapper's heads own separately allocated (head_dim, d_in) weights.
      for (std::int64_t h = 0; h < cfg.n_heads; ++h) {
        const head_weights head = w.head(cfg, h);
        qkv_.push_back(pack_qkv(head.query, head.key, head.value));
      }
    }
    if (cfg.out_proj) out_proj_.emplace(detail::pack_linear(cpu_engine(), w.out_proj));
  }

  // The shape's steps for the calling thread's current OpenMP team size (execute sets it first).
  std::shared_ptr<const shape_steps> steps(std::int64_t batch, std::int64_t seq_len) const {
    return cache_.get(batch, seq_len, omp_get_max_threads(), [&] {
      return rethrowing_dnnl_errors(
          [&] {
            return text("building the primitives of ",
                        to_string(problem{config(), formulation(), batch, seq_len}));
          },
          [&] {
            return std::make_shared<const shape_steps>(cpu_engine(), config(), formulation(), batch,
                                                       seq_len, qkv_.front().query,
                                                       out_proj_ ? &*out_proj_ : nullptr);
          });
    });
  }

  std::array<std::size_t, piece::piece_count> sizes(const shape_steps& s) const {
    const mha::config& cfg = config();
    const auto rows = static_cast<std::size_t>(s.batch * s.seq_len);
    const auto d_out = static_cast<std::size_t>(cfg.d_out);
    const auto qkv_floats =
        rows * static_cast<std::size_t>(
                   formulation() == mha::formulation::split_weight ? cfg.d_out : cfg.head_dim());
    std::array<std::size_t, piece::piece_count> n{};
    n[piece::scratchpad] = (s.scratchpad_bytes + sizeof(float) - 1) / sizeof(float);
    n[piece::staging] = s.head_split ? rows * d_out : 0;
    n[piece::q] = n[piece::k] = n[piece::v] = qkv_floats;
    n[piece::heads_out] = s.head_merge ? rows * d_out : 0;
    n[piece::context] = s.out_proj ? rows * d_out : 0;
    n[piece::scores] = s.attention.score_floats();
    return n;
  }

  void execute(tensor_view<const float> x, tensor_view<float> y,
               const run_options& options) const override {
    const openmp_threads threads(options.threads);
    // The scores of a group of heads (at least one T x T slice) and the causal mask (T x T).
    detail::check_score_memory("onednn", x.seq_len(), config().causal ? 2 : 1);
    const auto s = steps(x.batch(), x.seq_len());
    auto what = [&] {
      return text("running ", to_string(problem{config(), formulation(), x.batch(), x.seq_len()}));
    };
    rethrowing_dnnl_errors(what, [&] {
      const call_buffers b(sizes(*s));
      // The heads' merged output: out_proj's input, or y itself.
      float* context = s->out_proj ? b[piece::context] : y.data();
      // Attention writes head-major, then the merge moves it into `context`.
      float* heads_out = s->head_merge ? b[piece::heads_out] : context;
      const detail::dropout_spec dropout =
          options.training ? detail::dropout_spec{config().dropout, options.seed}
                           : detail::dropout_spec{};
      dnnl::stream stream(cpu_engine());
      if (formulation() == mha::formulation::split_weight) {
        split_weight(*s, stream, x.data(), heads_out, b, dropout);
      } else {
        wrapper(*s, stream, x.data(), heads_out, b, dropout);
      }
      if (s->head_merge) s->head_merge->run(stream, heads_out, context, b.scratchpad_bytes());
      if (s->out_proj) {
        s->out_proj->run(stream, context, out_proj_->weight_data(), out_proj_->bias_data(),
                         y.data(), nullptr, b.scratchpad_bytes());
      }
      stream.wait();
    });
  }

  // out (rows, width) = x W^T + b with the shape's projection.
  static void project(const shape_steps& s, dnnl::stream& stream, const float* x,
                      const packed_linear& w, float* out, const call_buffers& b) {
    s.projection.run(stream, x, w.weight_data(), w.bias_data(), out, nullptr, b.scratchpad_bytes());
  }

  // Attention over `count` consecutive (seq_len, head_dim) slices of q, k, v into out, a group
  // at a time; slice i is (b, h) = where(i) for the dropout mask.
  template <class Where>
  void attend(const shape_steps& s, dnnl::stream& stream, const call_buffers& b, const float* q,
              const float* k, const float* v, float* out, std::int64_t count,
              const detail::dropout_spec& dropout, Where where) const {
    const std::int64_t group = s.attention.group(), hd = config().head_dim();
    const std::int64_t slice = s.seq_len * hd;
    for (std::int64_t first = 0; first < count; first += group) {
      const std::int64_t at = first * slice;
      auto between = [&](float* weights) {
        if (!dropout.active()) return;
        apply_dropout(dropout, weights, group, s.seq_len,
                      [&](std::int64_t i) { return where(first + i); });
      };
      s.attention.run_group(stream, q + at, k + at, v + at, out + at, b[piece::scores],
                            b.scratchpad_bytes(), between);
      if (config().causal) {
        stream.wait();
        keep_causal_rows_finite(s, stream, b, q + at, k + at, v + at, out + at, between);
      }
    }
  }

  // The dense products multiply masked weights (0) by every key and value, and a masked score
  // is computed before the mask is added: a NaN or Inf in token j's K or V would reach the rows
  // before j (0 * NaN, NaN + -inf). When a slice of the group has one, its rows before the first
  // such token are recomputed from K and V with the non-finite values replaced by 0, which those
  // rows never see: their outputs are then exactly those of the same input without the NaN.
  template <class Between>
  void keep_causal_rows_finite(const shape_steps& s, dnnl::stream& stream, const call_buffers& b,
                               const float* q, const float* k, const float* v, float* out,
                               Between& between) const {
    const std::int64_t group = s.attention.group(), hd = config().head_dim(), t = s.seq_len;
    const std::int64_t slice = t * hd;
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
    s.attention.run_group(stream, q, clean_k.data(), clean_v.data(), rows.data(), b[piece::scores],
                          b.scratchpad_bytes(), between);
    stream.wait();
    for (std::int64_t g = 0; g < group; ++g) {
      const std::int64_t keep = first_bad[static_cast<std::size_t>(g)] * hd;
      std::copy_n(rows.data() + g * slice, keep, out + g * slice);
    }
  }

  void split_weight(const shape_steps& s, dnnl::stream& stream, const float* x, float* heads_out,
                    const call_buffers& b, const detail::dropout_spec& dropout) const {
    const qkv& w = qkv_.front();
    for (const auto& [layer, out] :
         {std::pair{&w.query, b[piece::q]}, std::pair{&w.key, b[piece::k]},
          std::pair{&w.value, b[piece::v]}}) {
      if (s.head_split) {
        project(s, stream, x, *layer, b[piece::staging], b);
        s.head_split->run(stream, b[piece::staging], out, b.scratchpad_bytes());
      } else {
        project(s, stream, x, *layer, out, b);
      }
    }
    const std::int64_t heads = config().n_heads;
    attend(s, stream, b, b[piece::q], b[piece::k], b[piece::v], heads_out, s.batch * heads, dropout,
           [&](std::int64_t i) {
             return batch_head{i / heads, i % heads};
           });
  }

  void wrapper(const shape_steps& s, dnnl::stream& stream, const float* x, float* heads_out,
               const call_buffers& b, const detail::dropout_spec& dropout) const {
    const std::int64_t per_head = s.batch * s.seq_len * config().head_dim();
    for (std::int64_t h = 0; h < config().n_heads; ++h) {
      const qkv& w = qkv_[static_cast<std::size_t>(h)];
      project(s, stream, x, w.query, b[piece::q], b);
      project(s, stream, x, w.key, b[piece::k], b);
      project(s, stream, x, w.value, b[piece::v], b);
      attend(s, stream, b, b[piece::q], b[piece::k], b[piece::v], heads_out + h * per_head, s.batch,
             dropout, [&](std::int64_t i) {
               return batch_head{i, h};
             });
    }
  }

  std::vector<qkv> qkv_;  // split_weight: one entry; wrapper: one per head, in head order
  std::optional<packed_linear> out_proj_;
  step_cache cache_;
};

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
    return std::make_unique<onednn_plan>(cfg, form, w);
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
  return introspected("onednn_implementations", p, batch, seq_len).implementations(batch, seq_len);
}

std::vector<int> detail::onednn_cached_team_sizes(const plan& p, std::int64_t batch,
                                                  std::int64_t seq_len) {
  return introspected("onednn_cached_team_sizes", p, batch, seq_len)
      .cached_team_sizes(batch, seq_len);
}

}  // namespace mha
