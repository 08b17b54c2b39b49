#include <algorithm>
#include <cstring>
#include <functional>
#include <new>

#if defined(__linux__)
#include <sys/mman.h>
#endif

#include "base/checks.hpp"
#include "base/key4.hpp"
#include "base/text.hpp"
#include "mha/backend.hpp"
#include "mha/error.hpp"

namespace mha {
namespace {

// The KV cache's storage starts on a cache line (and an AVX-512 register), and a storage of at
// least a huge page on a huge page: a decode step streams the whole cache, and on Linux the
// storage asks for transparent huge pages (madvise, where the system leaves them to the
// program), so that the stream does not take a TLB miss every 4 KiB. B32 over 2k cached tokens
// on a 2-core Xeon, 1 thread: fp32 cache 33.5 -> 30.4 ms, int8 15.6 -> 13.8 (docs/design.md §5.1).
constexpr std::size_t line_alignment = 64, huge_page = std::size_t{2} << 20;
std::size_t storage_alignment(std::int64_t bytes) noexcept {
  return static_cast<std::size_t>(bytes) >= huge_page ? huge_page : line_alignment;
}

using detail::text;

// What backend::supports() and a plan without incremental calls say about decode.
constexpr std::string_view decode_declined = "decode with a KV cache (past > 0) is not implemented";
// ... and about a cache in another precision than the plan's.
std::string cache_declined(precision kv, precision plan) {
  return text("a KV cache of ", to_string(kv), " with a ", to_string(plan),
              " plan is not implemented");
}

std::string shape_of(const auto& view) {
  return text("(", view.batch(), ", ", view.seq_len(), ", ", view.features(), ")");
}

// True when [a, a + a_size) and [b, b + b_size) share a float.
bool overlap(const float* a, std::int64_t a_size, const float* b, std::int64_t b_size) {
  std::less<const float*> before;  // total order even for unrelated pointers
  return before(a, b + b_size) && before(b, a + a_size);
}

void check_run(std::string_view where, const config& cfg, tensor_view<const float> x,
               tensor_view<float> y, const run_options& options) {
  // The sizes first: an empty input's data may be null, and its size is what is wrong.
  if (x.batch() < 1)
    throw invalid_argument(text(where, ": input batch (", x.batch(), ") must be >= 1"));
  if (x.seq_len() < 1) {
    throw invalid_argument(text(where, ": input seq_len (", x.seq_len(), ") must be >= 1"));
  }
  if (x.data() == nullptr) throw invalid_argument(text(where, ": input x has no data (nullptr)"));
  if (y.data() == nullptr) throw invalid_argument(text(where, ": output y has no data (nullptr)"));
  if (x.seq_len() > cfg.context_length) {
    throw invalid_argument(text(where, ": input seq_len (", x.seq_len(),
                                ") exceeds context_length (", cfg.context_length, ")"));
  }
  if (x.features() != cfg.d_in) {
    throw invalid_argument(text(where, ": input x is ", shape_of(x), ", its last dimension (",
                                x.features(), ") must equal d_in (", cfg.d_in, ")"));
  }
  if (y.batch() != x.batch() || y.seq_len() != x.seq_len() || y.features() != cfg.out_width()) {
    throw invalid_argument(text(where, ": output y is ", shape_of(y), ", expected (", x.batch(),
                                ", ", x.seq_len(), ", ", cfg.out_width(), ") for input ",
                                shape_of(x)));
  }
  detail::check_byte_count(where, "input x", {x.batch(), x.seq_len(), x.features()}, sizeof(float));
  detail::check_byte_count(where, "output y", {y.batch(), y.seq_len(), y.features()},
                           sizeof(float));
  // Scores of one head, for backends that materialise them.
  detail::check_byte_count(where, "attention scores", {x.seq_len(), x.seq_len()}, sizeof(float));
  if (overlap(x.data(), x.size(), y.data(), y.size())) {
    throw invalid_argument(
        text(where, ": input x and output y overlap in memory; run() needs ", "separate buffers"));
  }
  if (options.threads < 0 || options.threads > max_run_threads) {
    throw invalid_argument(text(where, ": run_options.threads (", options.threads,
                                ") must be >= 0 (0 = all cores) and <= ", max_run_threads));
  }
}

}  // namespace

void plan::run(tensor_view<const float> x, tensor_view<float> y, const run_options& options) const {
  check_run(backend_name_, config_, x, y, options);
  execute(x, y, options);
}

kv_cache::kv_cache(const plan* owner, mha::precision precision, std::int64_t batch,
                   std::int64_t capacity, std::int64_t heads, std::int64_t head_bytes)
    : owner_(owner),
      precision_(precision),
      capacity_(capacity),
      heads_(heads),
      head_bytes_(head_bytes),
      bytes_(batch * heads * head_bytes),
      slots_(capacity),
      lengths_(static_cast<std::size_t>(batch), 0),
      data_(static_cast<std::byte*>(::operator new (static_cast<std::size_t>(bytes_),
                                                    std::align_val_t{storage_alignment(bytes_)})),
            aligned_delete{storage_alignment(bytes_)}) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  // Advice only: where huge pages are off (or always on) this changes nothing.
  if (data_.get() != nullptr && storage_alignment(bytes_) == huge_page)
    madvise(data_.get(), static_cast<std::size_t>(bytes_), MADV_HUGEPAGE);
#endif
  // Zeroed: the stated bytes are committed now, and the padding of a layout's panels holds
  // finite values that the kernels may read (and discard).
  std::memset(data_.get(), 0, static_cast<std::size_t>(bytes_));
}

kv_cache::claim::claim(const kv_cache& cache, std::string_view where) : cache_(cache) {
  if (cache.in_use_.held.exchange(true, std::memory_order_acquire)) {
    throw invalid_argument(text(where,
                                ": the kv_cache is in use by another call (on another thread); "
                                "a cache is one caller's at a time: make one cache per thread"));
  }
}

kv_cache::claim::~claim() { cache_.in_use_.held.store(false, std::memory_order_release); }

void kv_cache::aligned_delete::operator()(std::byte* p) const noexcept {
  ::operator delete (p, std::align_val_t{alignment});
}

std::int64_t kv_cache::length(std::int64_t b) const {
  if (b < 0 || b >= batch()) {
    throw invalid_argument(text("kv_cache: sequence ", b, " is out of range; the cache holds ",
                                batch(), " (0 to ", batch() - 1, ")"));
  }
  return lengths_[static_cast<std::size_t>(b)];
}

void kv_cache::reset() {
  const claim held(*this, "kv_cache: reset");
  std::fill(lengths_.begin(), lengths_.end(), 0);
}

void kv_cache::reset(std::int64_t b) {
  length(b);  // the range check
  const claim held(*this, "kv_cache: reset");
  lengths_[static_cast<std::size_t>(b)] = 0;
}

void kv_cache::truncate(std::int64_t b, std::int64_t length) {
  this->length(b);  // the range check of b
  const claim claimed(*this, "kv_cache: truncate");
  const std::int64_t held = lengths_[static_cast<std::size_t>(b)];
  if (length < 0 || length > held) {
    throw invalid_argument(text("kv_cache: truncate to length ", length, " of sequence ", b,
                                " must be in [0, ", held, "], the tokens it holds"));
  }
  if (slots_ < capacity_ && held - length > ring_chunk && length > 0) {
    throw invalid_argument(text("kv_cache: truncate sequence ", b, " from ", held, " to ", length,
                                " tokens: its sliding window's ring (window ", window_, ") keeps ",
                                ring_chunk,
                                " tokens past the window, so at most that many can be taken back"));
  }
  if (precision_ == mha::precision::int4 && length < held) {
    // Its keys are coded in channel groups of 64 tokens: the group a rollback leaves unfilled
    // must have its keys exact (base/key4.hpp keeps the last 128 positions').
    for (std::int64_t g = 0; g < heads_; ++g) {
      std::byte* head = data_.get() + (b * heads_ + g) * head_bytes_;
      if (detail::key4_can_truncate(detail::key4_positions(head, head_bytes_), length)) continue;
      throw invalid_argument(
          text("kv_cache: truncate sequence ", b, " from ", held, " to ", length,
               " tokens: an int4 cache codes its keys in groups of ", detail::key4_group,
               " tokens and keeps the exact keys of its last ", detail::key4_recent,
               " positions only; tokens ", detail::key4_coded_end(length), " to ", length - 1,
               " would be left uncoded without them (take it back to ",
               detail::key4_coded_end(length), ", a whole group, instead)"));
    }
  }
  lengths_[static_cast<std::size_t>(b)] = length;
}

kv_cache kv_cache::copy() const {
  const claim held(*this, "kv_cache: copy");
  kv_cache made(owner_, precision_, batch(), capacity_, heads_, head_bytes_);
  made.attention_ = attention_;
  made.window_ = window_;
  made.slots_ = slots_;
  made.lengths_ = lengths_;
  std::memcpy(made.data_.get(), data_.get(), static_cast<std::size_t>(bytes_));
  return made;
}

std::int64_t plan::cache_head_bytes(std::int64_t, mha::precision) const noexcept { return 0; }

std::int64_t plan::cache_heads() const noexcept { return config_.kv_heads(); }

kv_cache plan::make_cache(std::int64_t batch, std::int64_t capacity,
                          std::optional<mha::precision> kv) const {
  const mha::precision format = kv.value_or(config_.precision);
  if (std::find(std::begin(cache_precisions), std::end(cache_precisions), format) ==
      std::end(cache_precisions)) {
    throw invalid_argument(text(backend_name_, ": unknown KV cache precision value ",
                                static_cast<int>(format), "; expected ", cache_precision_names));
  }
  if (cache_head_bytes(1, config_.precision) == 0)
    throw unsupported(text(backend_name_, ": ", decode_declined));
  if (cache_head_bytes(1, format) == 0) {
    throw unsupported(text(backend_name_, ": ", cache_declined(format, config_.precision),
                           " (backend::supports says why)"));
  }
  if (batch < 1)
    throw invalid_argument(text(backend_name_, ": cache batch (", batch, ") must be >= 1"));
  if (capacity < 1 || capacity > config_.context_length) {
    throw invalid_argument(text(backend_name_, ": cache capacity (", capacity,
                                ") must be between 1 and context_length (", config_.context_length,
                                ")"));
  }
  // The nominal size first, so that the layout's own arithmetic cannot overflow.
  detail::check_byte_count(backend_name_, "kv cache",
                           {2, batch, capacity, cache_heads(), config_.head_dim()}, sizeof(float));
  const std::int64_t head_bytes = cache_head_bytes(capacity, format);
  detail::check_byte_count(backend_name_, "kv cache", {batch, cache_heads(), head_bytes}, 1);
  try {
    return kv_cache(this, format, batch, capacity, cache_heads(), head_bytes);
  } catch (const std::bad_alloc&) {
    throw error(text(backend_name_, ": a kv cache of ", batch, " sequences of capacity ", capacity,
                     " needs ", batch * cache_heads() * head_bytes,
                     " bytes, which could not be allocated"));
  }
}

void plan::run(tensor_view<const float> x, tensor_view<float> y, kv_cache& cache,
               const run_options& options) const {
  check_run(backend_name_, config_, x, y, options);
  const kv_cache::claim held(cache, backend_name_);
  if (cache.owner_ != this) {
    throw invalid_argument(
        text(backend_name_, ": the kv_cache was made ",
             cache.owner_ ? "by another plan" : "for attention calls (mha::make_attention_cache)",
             "; a cache is read in the layout of the plan that made it"));
  }
  if (cache.batch() != x.batch()) {
    throw invalid_argument(text(backend_name_, ": input batch (", x.batch(),
                                ") must equal the cache's batch (", cache.batch(), ")"));
  }
  for (std::int64_t b = 0; b < cache.batch(); ++b) {
    const std::int64_t past = cache.lengths_[static_cast<std::size_t>(b)];
    if (past + x.seq_len() > cache.capacity()) {
      throw invalid_argument(text(backend_name_, ": sequence ", b, " holds ", past, " tokens; ",
                                  x.seq_len(), " more make ", past + x.seq_len(),
                                  ", past the cache's capacity (", cache.capacity(), ")"));
    }
  }
  execute(x, y, cache, options);
  for (std::int64_t& length : cache.lengths_) length += x.seq_len();
}

void plan::execute(tensor_view<const float>, tensor_view<float>, kv_cache&,
                   const run_options&) const {
  throw unsupported(text(backend_name_, ": ", decode_declined));
}

std::unique_ptr<plan> backend::prepare(const config& cfg, formulation form,
                                       const weights& w) const {
  const std::string where(name());
  detail::check_config(cfg, where);
  if (std::ranges::find(formulations(), form) == formulations().end()) {
    throw invalid_argument(text(where, ": unknown formulation value ", static_cast<int>(form)));
  }
  if (const support s = supports(problem{cfg, form}); !s) {
    throw unsupported(text(where, ": does not compute ", to_string(form), " with ", to_string(cfg),
                           ": ", s.reason()));
  }
  validate(cfg, w);
  return make_plan(cfg, form, w);
}

support detail::supports_axes(const problem& p, computed_axes axes) {
  if (p.cfg.precision != precision::fp32 && !(axes.bf16 && p.cfg.precision == precision::bf16)) {
    return support::no(text(to_string(p.cfg.precision), " precision is not implemented"));
  }
  if (!axes.grouped_kv && p.cfg.kv_heads() != p.cfg.n_heads) {
    return support::no(text("grouped-query attention (n_kv_heads ", p.cfg.kv_heads(), " < n_heads ",
                            p.cfg.n_heads, ") is not implemented"));
  }
  if (!axes.decode && p.past != 0) return support::no(std::string(decode_declined));
  if (!axes.extensions && p.cfg.window > 0) {
    return support::no(text("a sliding window (window ", p.cfg.window, ") is not implemented"));
  }
  if (!axes.extensions && p.cfg.sinks) {
    return support::no("attention sinks are not implemented");
  }
  if (!axes.extensions && p.cfg.softcap > 0.0) {
    return support::no(text("logit soft-capping (softcap ", p.cfg.softcap, ") is not implemented"));
  }
  // The kernel sets keep a cache in their plan's precision, or (coded_cache) in int8, k8v4 or
  // int4.
  const precision kv = p.cache_precision();
  if (kv != p.cfg.precision && !(axes.coded_cache && coded(kv))) {
    if (std::find(std::begin(cache_precisions), std::end(cache_precisions), kv) ==
        std::end(cache_precisions)) {
      return support::no(text("unknown KV cache precision value ", static_cast<int>(kv)));
    }
    return support::no(cache_declined(kv, p.cfg.precision));
  }
  return support::yes();
}

support backend::supports(const problem& p) const { return detail::supports_axes(p, {}); }

}  // namespace mha
