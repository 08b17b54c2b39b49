// The attention framework of the SIMD kernels: the per-thread workspace, the schedule of a call
// (its appends to a KV cache, tasks and split-KV merges) and its single-threaded loop. The
// geometry is attention_layout.cpp's, packing attention_pack.cpp's. Compiled with the baseline
// flags.
#include "kernels/interface/attention.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>

#include "base/checks.hpp"
#include "base/int8.hpp"
#include "kernels/interface/isa_kernels.hpp"

namespace mha::detail {

attention_workspace::attention_workspace(const attention_layout& layout, bool packs_heads)
    : layout_(layout),
      head_(packs_heads && !layout.bf16 ? static_cast<std::size_t>(layout.head_units()) : 0),
      scratch_(static_cast<std::size_t>(layout.scratch_floats())),
      pair_head_(packs_heads && layout.bf16 ? static_cast<std::size_t>(layout.head_units()) : 0) {}

void attention_workspace::run(const isa_kernels& kernels, const attention_args& args,
                              attention_task task) noexcept {
  void* own = layout_.bf16 ? static_cast<void*>(pair_head_.data()) : head_.data();
  if (head_.size() > 0 || pair_head_.size() > 0) {
    if (const std::int64_t head = task.b * args.kv_heads() + task.g; head != packed_) {
      pack_head(kernels, args, layout_, task.b, task.g, own);
      packed_ = head;
    }
    task.head = own;
  }
  kernels.attention_rows(args, layout_, task, scratch_.data());
}

bool attention_workspace::reuse_for(const attention_layout& layout) noexcept {
  if (head_.size() > 0 || pair_head_.size() > 0 ||
      scratch_.size() < static_cast<std::size_t>(layout.scratch_floats()))
    return false;
  layout_ = layout;
  return true;
}

attention_workspace& thread_workspace(const attention_layout& layout) {
  thread_local std::optional<attention_workspace> kept;
  if (!kept || !kept->reuse_for(layout)) kept.emplace(layout, false);
  return *kept;
}

attention_schedule::attention_schedule(const isa_kernels& kernels, const attention_args& args,
                                       std::int64_t key_tile)
    : kernels_(kernels), args_(args) {
  // The most keys a sequence holds, and the most its first query row reads (a window's).
  std::int64_t keys = 0, span = 0;
  for (std::int64_t b = 0; b < args.batch; ++b) {
    keys = std::max(keys, this->keys(b));
    span = std::max(span, this->keys(b) - args.window_begin(past(b)));
  }
  const bool split = args.seq_len <= split_rows && span > split_keys;
  if (key_tile == 0) key_tile = split ? decode_key_tile : default_key_tile;
  attention_request request{
      .seq_len = args.seq_len,
      .keys = keys,
      .head_dim = args.head_dim,
      .key_tile = key_tile,
      .kv_rows = args.cache ? args.cache->capacity : 0,
      .group = args.kv_group,
      .bf16_operands = args.bf16,
      .in_place = args.heads_in_place && args.cache == nullptr &&
                  (!args.bf16 || args.bf16_operands()) && !args.dropout.active(),
      .plain_scores = !args.dropout.active() && !args.masks_keys() && args.softcap == 0.0f &&
                      args.sinks == nullptr,
  };
  if (args.cache) request.cache_format(args.cache->format);
  layout_ = kernels.layout(request);
  if (args.cache && args.cache->ring) pieces_ = 2;
  // Counted from the first key rounded down to the key step, as chunk_keys sizes them: one chunk
  // more than the window's own keys make where the rounding passes a multiple of split_keys (a
  // window of 4,096 over 4,097 keys).
  for (std::int64_t b = 0; split && b < args.batch; ++b) chunks_ = std::max(chunks_, key_chunks(b));
  per_head_ = (split ? chunks_ : layout_.blocks()) * pieces_;
  if (merges() > 0) {
    // Per (b, g, chunk, piece), seq_len * kv_group stacked rows: batch * heads * seq_len in all.
    partials_ = float_buffer(static_cast<std::size_t>(
        args.batch * args.heads * partials_per_head() * args.seq_len * (args.head_dim + 2)));
    if (args.out16.data != nullptr)
      merged_ = float_buffer(static_cast<std::size_t>(merges() * args.head_dim));
  }
}

std::int64_t attention_schedule::appends() const noexcept {
  return args_.cache ? args_.batch * args_.kv_heads() : 0;
}

void attention_schedule::append(std::int64_t i) const noexcept {
  const std::int64_t b = i / args_.kv_heads(), g = i % args_.kv_heads(), past = this->past(b);
  const kv_store& cache = *args_.cache;
  if (layout_.keys4) return pack_keys4(args_, layout_, b, g, past, cache.head(b, g));
  // An int8 head's channel scales are set by these keys (the sequence's first, or the first
  // appended at all: channel_scales_set).
  const bool first =
      past == 0 || (layout_.int8 && !channel_scales_set(reinterpret_cast<const float*>(
                                        cache.head(b, g) + layout_.channels_offset())));
  if (!cache.ring) {
    pack_keys(kernels_, args_, layout_, b, g, past, past + args_.seq_len, cache.head(b, g), first);
    return;
  }
  // A ring: the new keys at their slots, in two runs where they pass its end (a call holds
  // fewer keys than the ring: mha::ring_chunk).
  const std::int64_t slot = cache.slot(past);
  const std::int64_t before_end = std::min(args_.seq_len, cache.capacity - slot);
  pack_keys(kernels_, args_, layout_, b, g, slot, slot + before_end, cache.head(b, g), first);
  if (before_end < args_.seq_len) {
    attention_args rest = args_;  // the keys from row before_end on
    rest.k.data = args_.k.row(0, 0, before_end);
    rest.v.data = args_.v.row(0, 0, before_end);
    pack_keys(kernels_, rest, layout_, b, g, 0, args_.seq_len - before_end, cache.head(b, g),
              false);
  }
}

std::int64_t attention_schedule::first_key(std::int64_t b, std::int64_t row) const noexcept {
  const std::int64_t first = args_.window_begin(past(b) + row);
  return first - first % layout_.key_step;
}

std::int64_t attention_schedule::key_chunks(std::int64_t b) const noexcept {
  return (keys(b) - first_key(b, 0) + split_keys - 1) / split_keys;
}

std::int64_t attention_schedule::chunk_keys(std::int64_t b) const noexcept {
  // key_chunks of equal keys up to the key step: 2049 keys are 1040 + 1009, not 2048 + a task and
  // a merge for one.
  const std::int64_t span = keys(b) - first_key(b, 0), chunks = key_chunks(b);
  return round_up((span + chunks - 1) / chunks, layout_.key_step);
}

float* attention_schedule::partial(std::int64_t b, std::int64_t g,
                                   std::int64_t chunk) const noexcept {
  const std::int64_t stacked = args_.seq_len * args_.kv_group;  // rows per (b, g)
  return partials_.data() + ((b * args_.kv_heads() + g) * partials_per_head() + chunk) * stacked *
                                (args_.head_dim + 2);
}

void attention_schedule::run(std::int64_t i, attention_workspace& workspace) const noexcept {
  const std::int64_t head = i / per_head_, part = (i % per_head_) / pieces_, piece = i % pieces_;
  attention_task t;
  t.b = head / args_.kv_heads();
  t.g = head % args_.kv_heads();
  t.past = past(t.b);
  if (args_.cache) t.head = args_.cache->head(t.b, t.g);
  if (chunks_ > 1) {
    t.row_end = args_.seq_len;
    t.key_begin = first_key(t.b, 0) + part * chunk_keys(t.b);
    t.key_end = std::min(t.key_begin + chunk_keys(t.b), keys(t.b));
    t.partial = partial(t.b, t.g, part * pieces_ + piece);
  } else {
    t.row_begin = part * layout_.block_positions;
    t.row_end = std::min(t.row_begin + layout_.block_positions, args_.seq_len);
    // With a window, the keys before the block's first row's window are never read: O(T w).
    t.key_begin = first_key(t.b, t.row_begin);
    t.key_end = keys(t.b);
    if (pieces_ > 1) t.partial = partial(t.b, t.g, piece);
  }
  if (pieces_ > 1) {
    // A ring: this piece of the keys, before the wrap that follows key_begin or after it, in
    // slots with the positions shifted by its base.
    const std::int64_t slots = args_.cache->capacity;
    MHA_EXPECTS(t.key_begin >= t.key_end || t.key_begin >= keys(t.b) - slots);
    const std::int64_t wrap = (t.key_begin / slots + 1) * slots;
    const std::int64_t base = piece == 0 ? wrap - slots : wrap;
    if (piece == 1) t.key_begin = std::max(t.key_begin, wrap);
    if (piece == 0) t.key_end = std::min(t.key_end, wrap);
    t.key_begin -= base;
    t.key_end -= base;
    t.past -= base;
  }
  if (t.key_begin >= t.key_end) {  // no key here (a shorter sequence's chunk, an empty piece)
    if (t.partial != nullptr) empty_partial(t);
    return;
  }
  workspace.run(kernels_, args_, t);
}

void attention_schedule::empty_partial(const attention_task& t) const noexcept {
  const std::int64_t hd = args_.head_dim;
  for (std::int64_t r = t.row_begin * args_.kv_group; r < t.row_end * args_.kv_group; ++r) {
    float* part = t.partial + r * (hd + 2);
    std::fill(part, part + hd, 0.0f);
    part[hd] = -std::numeric_limits<float>::infinity();
    part[hd + 1] = 0.0f;
  }
}

void attention_schedule::merge(std::int64_t i) const noexcept {
  // out = (sum_c O_c 2^(m_c - m)) / (sum_c l_c 2^(m_c - m)), m = max_c m_c, in chunk order
  // (with a mask the maxima are halved: 2^(2 (m_c - m)).
  const std::int64_t b = i / args_.kv_heads(), g = i % args_.kv_heads(), hd = args_.head_dim;
  const std::int64_t group = args_.kv_group;
  const std::int64_t chunks = partials_per_head();
  for (std::int64_t r = 0; r < args_.seq_len * group; ++r) {
    const auto row = [&](std::int64_t c) { return partial(b, g, c) + r * (hd + 2); };
    float m = -std::numeric_limits<float>::infinity();
    for (std::int64_t c = 0; c < chunks; ++c) m = std::max(m, row(c)[hd]);
    // Stacked row r is query head g * group + r % group at position r / group.
    const std::int64_t h = g * group + r % group, position = r / group;
    float* out = args_.out16.data ? merged_.data() + i * hd : args_.out.row(b, h, position);
    float sum = 0.0f;
    std::fill(out, out + hd, 0.0f);
    for (std::int64_t c = 0; c < chunks; ++c) {
      const float* part = row(c);
      if (part[hd + 1] == 0.0f) continue;  // no key of chunk c for this row
      const float f = std::exp2(args_.mask.exponent_scale() * (part[hd] - m));
      sum += f * part[hd + 1];
      for (std::int64_t d = 0; d < hd; ++d) out[d] += f * part[d];
    }
    const float inv = output_factor(args_, h, m, sum);
    for (std::int64_t d = 0; d < hd; ++d) out[d] *= inv;
    if (args_.out16.data) {
      bf16* to = args_.out16.row(b, h, position);
      for (std::int64_t d = 0; d < hd; ++d) to[d] = to_bf16(out[d]);
    }
  }
}

void attention(const isa_kernels& kernels, const attention_args& args, std::int64_t key_tile) {
  const attention_schedule schedule(kernels, args, key_tile);
  for (std::int64_t i = 0; i < schedule.appends(); ++i) schedule.append(i);
  std::optional<attention_workspace> packing;
  if (schedule.packs_heads()) packing.emplace(schedule.layout(), true);
  attention_workspace& workspace = packing ? *packing : thread_workspace(schedule.layout());
  for (std::int64_t i = 0; i < schedule.tasks(); ++i) schedule.run(i, workspace);
  for (std::int64_t i = 0; i < schedule.merges(); ++i) schedule.merge(i);
}

}  // namespace mha::detail
