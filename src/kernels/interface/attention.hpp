// Internal: the attention half of the SIMD kernels' framework (ISA-neutral, compiled once): the
// geometry of the fused kernel (query blocks, key tiles, workspaces), the packing of a head's K
// and V (into a workspace, or into a KV cache kept in the same packed form), and the schedule
// of one attention call as independent tasks. The per-ISA kernel is in
// micro/attention_kernel.hpp.
//
// Per (batch, K/V head), K^T and V are packed into the GEMM's panel form (gemm.hpp); query rows are
// processed in blocks whose scores stay in cache (attention_layout). A KV cache holds each head
// already packed, so a decode step streams it once, and a row's arithmetic is the same whether
// its keys were packed by this call or by earlier ones.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>

#include "common/attention_args.hpp"
#include "common/buffer.hpp"
#include "kernels/interface/gemm.hpp"

namespace mha::detail {

struct isa_kernels;

// Keys per online-softmax step of a forward call. Narrower tiles pay per-tile costs (row maxima,
// the rescale); 512 keys make a 64 x 512 score tile of 128 KB per thread, which stays in L2
// between the three stages, and run as fast as whole rows (measurements: docs/design.md §5.1).
inline constexpr std::int64_t default_key_tile = 512;

// Split-KV: a call of at most split_rows query positions (a decode step) over more than
// split_keys keys takes a sequence's keys in ceil(keys / split_keys) chunks of equal size (up to
// the key step), one task each, and merges the chunks' partial softmax results per head in chunk
// order. The chunks depend on the keys only, so the
// result is the same for every thread count (and on the xsimd backend, which runs the same
// chunks in order); it differs from an unsplit call by rounding. 2048 keys of head_dim 64 are
// 1 MiB of K and V: enough work per task to hide its cost, and B1 H12 at 8k keys makes 48
// tasks (with grouped K/V heads, kv_heads * 4).
inline constexpr std::int64_t split_rows = 8;
inline constexpr std::int64_t split_keys = 2048;

// Keys per online-softmax step of a call that splits its keys: its score tile is a few rows, so
// a tile as long as a split's chunk costs no cache, and fewer phases per chunk stream K and V
// longer (measurements: docs/design.md §5.1). A decode call that does not split keeps
// default_key_tile, so that it rounds exactly as the full forward's rows do.
inline constexpr std::int64_t decode_key_tile = split_keys;

// The most stacked query rows of a block that reads K and V in place (attention_layout::in_place).
inline constexpr std::int64_t direct_rows = 8;

// The most dimensions of a head the narrow path takes (attention_path::narrow).
inline constexpr std::int64_t narrow_dims = 8;

// The attention kernel's paths, one type each in its own file under micro/, chosen once per call
// by isa_kernels::layout (attention_layout::path); micro/attention_kernel.hpp runs the chosen one.
//   codes   an int8, k8v4 or int4 cache's codes: Q K^T and P V on integers (packed_attention
//           over code_pair_dot)
//   packed  K^T and V in the GEMM's panels (packed by the call, or a cache's), fp32 or bf16
//           pairs, on the register-tiled micro-kernels (packed_attention)
//   tiles   packed bf16 pairs on the ISA's tile products (AMX), for blocks of several rows (a
//           panel narrower than a tile, or a block of one row, still takes vectors)
//   direct  K and V read where they lie (attention_layout::in_place), fp32 or bf16: a block of
//           a few rows reads each key once (direct_attention)
//   narrow  fp32 heads of at most narrow_dims dimensions whose scores go to the softmax as they
//           are: a register of rows per key, K and V packed or in place (narrow_attention)
enum class attention_path : std::uint8_t { codes, packed, tiles, direct, narrow };

// The parts of one query block's scratch (attention_layout::scratch_parts).
struct attention_scratch {
  float* queries;             // block_rows x head_dim: the block's queries times scale (fp32)
  bf16_pair* query_pairs;     // bf16: block_rows x pairs(head_dim): the queries as pairs
  bf16_pair* weight_pairs;    // bf16: block_rows x pairs(score_cols): P as pairs
  float* scores;              // block_rows x score_cols: one key tile's scores, then weights
                              // (an int8 cache's: scores only; the narrow-head kernel: a
                              // register of rows per key)
  float* accumulators;        // block_rows x acc_cols: the output rows before dividing by row_sum
  float* row_max;             // block_rows: running max of each row's scores
  float* row_sum;             // block_rows: running sum of exp(score - row_max), undropped
  float* rescale;             // block_rows: exp(previous row_max - row_max) of the current key tile
  float* dropout;             // score_cols: one row's dropout multipliers over a key tile
  float* query_sums;          // int8: block_rows: each row's sum of its (scaled) queries (int4:
                              // its sum of the queries times a key group's channel offsets)
  float* query_scales;        // int8: block_rows: each row's scale of its 16-bit integers
  std::int32_t* query_codes;  // int8: block_rows x query_units(): those integers in pairs
  float* value_offsets;       // int8: block_rows x value_groups(): one key tile's sum of P times
                              // the values' offsets, per group of the values
  std::int32_t* weight_codes;  // int8: block_rows x value_groups() x pairs(score_cols): P times
                               // the values' scales as 16-bit integers in pairs of keys
  float* weight_scales;        // int8: block_rows x value_groups() x weight_chunks(): each
                               // chunk's scale of them
};

// What an attention geometry is asked for (isa_kernels::layout), one field per fact.
struct attention_request {
  std::int64_t seq_len = 0;  // query positions per head
  std::int64_t keys = 0;     // the most key rows any sequence attends over
  std::int64_t head_dim = 0;
  std::int64_t key_tile = default_key_tile;  // keys per online-softmax step, rounded up to the
                                             // key step; keys or more: one step over whole rows
  std::int64_t kv_rows = 0;      // room per packed head: 0 = keys (heads packed per call); a KV
                                 // cache's capacity (its bf16 V panels then stay the narrowest)
  std::int64_t group = 1;        // query heads per K/V head, stacked in a block's rows
  bool bf16_operands = false;    // K^T, V and P as bf16 pairs (ignored with int8_codes)
  bool int8_codes = false;       // the heads of an int8, k8v4 or int4 KV cache
  bool four_bit_values = false;  // with int8_codes: a k8v4 or int4 cache's (values as 4-bit codes)
  bool four_bit_keys = false;    // with four_bit_values: an int4 cache's (keys as 4-bit codes)
  // The three fields above for a KV cache kept in `kv` (none for fp32 or bf16).
  constexpr attention_request& cache_format(precision kv) noexcept {
    int8_codes = coded(kv);
    four_bit_values = kv == precision::k8v4 || kv == precision::int4;
    four_bit_keys = kv == precision::int4;
    return *this;
  }
  // K and V may be read where they lie (attention_args::heads_in_place, no cache, no dropout,
  // operands in the compute precision): the layout then reads them so (in_place) when a block
  // stacks at most direct_rows rows.
  bool in_place = false;
  // No key mask, dropout, soft-cap or sinks: the scores go to the softmax as they are (the narrow
  // path computes nothing else).
  bool plain_scores = false;
};

// The geometry of the attention kernel on one ISA for one call: panel widths, the query-row
// block, the key tile, where a head's packed K^T and V lie, and the floats each workspace needs.
//
// Grouped-query attention: the `group` query heads of one K/V head are taken together, their
// rows stacked position-major (row r of a block is head r % group at position r / group), so a
// task streams each K/V head once for all its query heads (a decode step of a group of 8 is
// one 8-row block over the cache instead of 8 one-row blocks).
struct attention_layout {
  tile_shape scores, values;  // micro-kernels of S = Q K^T and of O = P V
  bool bf16 = false;          // operands in bf16 pairs (docs/design.md §1.5), else fp32
  // K and V as 8-bit codes with a scale and a zero per key (an int8 KV cache, §1.7), read
  // with fp32 queries and weights (never bf16 pairs: bf16 is then false).
  bool int8 = false;
  // With int8: V as 4-bit codes of turned groups (a k8v4 cache, base/value4.hpp), K as int8's.
  bool values4 = false;
  // With values4: K as 4-bit codes per channel of each group of key4_group keys, the newest
  // keys exact (an int4 cache, base/key4.hpp).
  bool keys4 = false;
  // The kernel's path (attention_path), decided here and nowhere else.
  attention_path path = attention_path::packed;
  // K and V read where they lie in attention_args (row-major rows of head_dim), not packed:
  // fp32, or bf16 with bf16 operands (attention_args::k16, v16), no cache, no dropout, at most
  // direct_rows stacked rows per block (a decode step or a chunk of a few tokens,
  // attention_args::heads_in_place). Packing a head costs as much memory traffic as reading it,
  // and such a block reads each key once. The direct path, or the narrow one.
  bool in_place = false;
  std::int64_t seq_len = 0;  // query positions per head
  std::int64_t group = 1;    // query heads per K/V head, stacked in a block's rows
  std::int64_t keys = 0;     // most keys any sequence attends over (past + seq_len)
  std::int64_t kv_rows = 0;  // keys a packed head has room for: `keys` in a workspace, the
                             // capacity in a KV cache
  std::int64_t head_dim = 0;
  std::int64_t block_positions = 0;  // query positions per attention_rows call (the last may
                                     // be fewer)
  std::int64_t block_rows = 0;       // block_positions * group stacked rows
  std::int64_t key_tile = 0;         // keys per online-softmax step: a multiple of scores.nr and of
                                     // the lanes; >= keys means one step over whole rows
  std::int64_t score_cols = 0;       // row stride of a scores tile: key_tile, or keys rounded
                                     // up like key_tile when that is smaller, plus two lines
                                     // where that is a multiple of 1 KiB (L1's sets)
  std::int64_t acc_cols = 0;         // head_dim rounded up to values.nr
  std::int64_t key_step = 0;         // the key tile's granule: scores.nr and the lanes divide it

  // A packed head, in units of its operands (floats, or bf16 pairs of 4 bytes alike): K^T
  // (head_dim, kv_rows) in panels of scores.nr at the start (bf16: pairs along head_dim), then
  // V (kv_rows, head_dim) in panels of values.nr at values_offset() (bf16: pairs along keys).
  // int8: in bytes, K^T codes (head_dim, kv_rows) in panels of scores.nr at the start (pairs
  // along head_dim: a panel row holds two codes of each of its keys, dimensions 2i and 2i + 1),
  // V codes (kv_rows, head_dim) in panels of values.nr at values_offset() (pairs along keys: a
  // panel row holds two codes of each of its dimensions, keys 2i and 2i + 1, as bf16's V), then
  // from scales_offset() two arrays of key_rows() int8_row words (a scale and a zero each,
  // base/int8.hpp): the keys', then the values'.
  // values4: V's codes instead in panels of values.nr 32-bit words, key_rows() / 8 word rows a
  // panel: word (w, c) holds column c's codes of keys 8w to 8w + 7, key 8w + 2i in bits 4i to
  // 4i + 3 and key 8w + 2i + 1 sixteen bits above, so that (word >> 4i) & 0x000f000f is a pair
  // of codes as int8's V pairs hold them; and after the keys' words, value_groups() arrays of
  // key_rows() value4_row words (base/value4.hpp), one per group of the values.
  // keys4: K^T's codes instead in panels of scores.nr 32-bit words, key4_words(head_dim) word
  // rows a panel: word (w, c) holds key c's codes of dimensions 8w to 8w + 7, dimension 8w + 2i in
  // bits 4i to 4i + 3 and 8w + 2i + 1 sixteen bits above (nibble_panels' pairs, as values4's V
  // words hold keys); the keys' words are then head_dim value4_rows per group of key4_group keys
  // (channel d of group t at t * head_dim + d), and the head ends with its recent exact keys
  // (key4_recent_bytes: no channel scales).
  std::int64_t head_units() const noexcept;
  std::int64_t values_offset() const noexcept;
  std::int64_t scales_offset() const noexcept;
  // int8: after them, at a cache line, the head's head_dim key channel scales (base/int8.hpp's
  // key_channel_scales: its keys are coded over them, its queries multiplied by them).
  std::int64_t channels_offset() const noexcept;
  std::int64_t key_rows() const noexcept { return round_up(kv_rows, key_step); }
  // The keys' words before the values' in the scales arrays: one per key row, or keys4's
  // channel group words.
  std::int64_t key_words() const noexcept;
  // The 16-bit query integers of a row, in pairs: pairs(head_dim), or keys4's 4 a word row.
  std::int64_t query_units() const noexcept;
  // The groups a value row's codes come in: value4_groups(head_dim) with values4, else 1.
  std::int64_t value_groups() const noexcept;
  // The bytes of a packed head.
  std::int64_t head_bytes() const noexcept;
  // The bytes one key adds to a packed head: its key and value (head_dim padded to values.nr),
  // and with int8 their scales and zeros.
  std::int64_t key_bytes() const noexcept;
  // One query block's scratch in floats: O(block_rows * (score_cols + head_dim)), independent
  // of the keys once keys >= key_tile.
  std::int64_t scratch_floats() const noexcept;
  // int8: the chunks of weight_chunk_keys keys (base/int8.hpp) a key tile's weights come in.
  std::int64_t weight_chunks() const noexcept;
  // Its scores part (attention_scratch::scores).
  std::int64_t score_floats() const noexcept;
  // Carves `scratch` (scratch_floats() floats, 64-byte aligned) into its parts, each aligned
  // (the bf16 parts only for a bf16 layout, the int8 parts for an int8 one, else nullptr).
  attention_scratch scratch_parts(float* scratch) const noexcept;
  // Query blocks per K/V head: ceil(seq_len / block_positions).
  std::int64_t blocks() const noexcept { return (seq_len + block_positions - 1) / block_positions; }
};

// One call of the per-ISA kernel (isa_kernels::attention_rows): the query heads of K/V head
// (b, g) at positions [row_begin, row_end), position i at absolute position past + i, over the
// keys in [key_begin, key_end) they attend to (key_begin a multiple of the layout's key step).
struct attention_task {
  const void* head = nullptr;  // the packed K^T and V of (b, g): floats, or bf16 pairs
  std::int64_t b = 0, g = 0, past = 0;
  std::int64_t row_begin = 0, row_end = 0, key_begin = 0, key_end = 0;
  // nullptr: the rows' outputs go to args.out. Else the chunk's partial softmax, per stacked
  // row (from row_begin * group on) head_dim + 2 floats: the unnormalised output, the running
  // max and the running sum (in base 2; -inf and 0 for a row that sees no key of the chunk),
  // for attention_schedule::merge.
  float* partial = nullptr;
};

// What a row's unnormalised output O is multiplied by at the end (docs/design.md §1.9): 1 / l,
// l its softmax's sum at the running max m (both in the kernels' base-2 units, halved with a
// mask), or with a sink s (query head h's logit, natural log) 1 / (l + e^(s - m)), taken at the
// larger of s and m so that nothing overflows. A row that saw no key (l 0, a masked row) gives
// zeros, with a sink too.
inline float output_factor(const attention_args& args, std::int64_t h, float m, float l) noexcept {
  if (args.sinks == nullptr) return args.masks_keys() && l == 0.0f ? 0.0f : 1.0f / l;
  const float e = args.mask.exponent_scale();
  const float sink = args.sinks[h] * 1.44269504088896341f / e;  // in m's units
  if (l == 0.0f) return 0.0f;
  if (sink <= m) return 1.0f / (l + std::exp2(e * (sink - m)));
  const float down = std::exp2(e * (m - sink));  // O and l at the sink's maximum
  return down / (l * down + 1.0f);
}

// Packing (attention_pack.cpp). Head (b, g) of args.k and args.v (all keys, from row 0) packed
// into `head` (layout.head_units() units, kv_rows == keys), rounded to bf16 in a bf16 layout
// (never int8: only a cache holds codes).
void pack_head(const isa_kernels& kernels, const attention_args& args,
               const attention_layout& layout, std::int64_t b, std::int64_t g, void* head) noexcept;
// Keys [j0, j1) of a cache's packed head at `head` from K/V head g of sequence b of args (its
// rows 0, 1, ... of args.k and args.v), rounded to bf16 pairs in a bf16 layout; in an int8 layout
// coded over the head's key channel scales, which the sequence's first keys (`first`) set.
void pack_keys(const isa_kernels& kernels, const attention_args& args, const attention_layout& l,
               std::int64_t b, std::int64_t g, std::int64_t j0, std::int64_t j1, void* head,
               bool first) noexcept;
// The new keys and values of K/V head g of sequence b of a call into an int4 cache's packed
// head at `head` (args' rows 0 to seq_len - 1 at positions past, past + 1, ...).
void pack_keys4(const attention_args& args, const attention_layout& l, std::int64_t b,
                std::int64_t g, std::int64_t past, std::byte* head) noexcept;

// One thread's attention workspace for one attention call (one layout): one query block's
// scratch and, when the heads are not in a cache, a packed head, O(keys * head_dim +
// block_rows * (key_tile + head_dim)) floats whatever the batch and head count. Allocated once;
// run() allocates nothing. Not shared between threads.
class attention_workspace {
 public:
  // Throws std::bad_alloc.
  attention_workspace(const attention_layout& layout, bool packs_heads);

  // The kernel on `task`; when the workspace packs heads, first packs K and V of (task.b,
  // task.g) unless they are the ones packed last (task.head is ignored then).
  void run(const isa_kernels& kernels, const attention_args& args, attention_task task) noexcept;

  // Takes `layout` for a next call that packs no heads, where its scratch is large enough;
  // false (and unchanged) where not, or where this workspace packs heads.
  bool reuse_for(const attention_layout& layout) noexcept;

 private:
  attention_layout layout_;
  float_buffer head_, scratch_;          // head_: one packed head (fp32 units)
  aligned_buffer<bf16_pair> pair_head_;  // ... in a bf16 layout
  std::int64_t packed_ = -1;             // b * kv_heads + g of the packed head, -1 before the first
};

// The calling thread's workspace for a call that packs no heads (attention_schedule::packs_heads
// false: decode steps, calls on a cache or reading K and V in place) with `layout`: kept for the
// thread's next calls, remade only when one needs more scratch (O(tile), never a head), so that
// such a call makes no workspace per thread: a decode step's call is tens of microseconds, and
// making and freeing a workspace per taking part thread was a visible part of it. Valid until
// the thread's next call of this function: take it for one call's tasks, which run on a thread
// one after another. Throws std::bad_alloc.
attention_workspace& thread_workspace(const attention_layout& layout);

// One attention call as phases of independent steps, for a sequential or a parallel loop:
//   appends():  with a cache, (b, g) pairs whose new keys and values go into the cache;
//   tasks():    (b, g, query block), or (b, g, key chunk) when the call splits its keys;
//   merges():   with a split, the (b, g) pairs whose chunks merge into args.out (else 0).
// Steps of one phase touch disjoint memory and may run in any order or concurrently; a phase
// starts when the one before has finished. The partition depends on the problem only.
class attention_schedule {
 public:
  // Throws std::bad_alloc (the split's partial results). key_tile 0: decode_key_tile for a call
  // that splits its keys, else default_key_tile.
  attention_schedule(const isa_kernels& kernels, const attention_args& args,
                     std::int64_t key_tile = 0);

  const attention_layout& layout() const noexcept { return layout_; }
  // Whether tasks read heads packed by the workspace (no cache, not direct) rather than from the
  // cache or in place.
  bool packs_heads() const noexcept { return args_.cache == nullptr && !layout_.in_place; }

  std::int64_t appends() const noexcept;
  void append(std::int64_t i) const noexcept;
  std::int64_t tasks() const noexcept { return args_.batch * args_.kv_heads() * per_head_; }
  // Task i on the calling thread's workspace (made with layout() and packs_heads()).
  void run(std::int64_t i, attention_workspace& workspace) const noexcept;
  std::int64_t merges() const noexcept {
    return chunks_ > 1 || pieces_ > 1 ? args_.batch * args_.kv_heads() : 0;
  }
  void merge(std::int64_t i) const noexcept;

 private:
  std::int64_t keys(std::int64_t b) const noexcept { return args_.keys(b); }
  std::int64_t past(std::int64_t b) const noexcept { return keys(b) - args_.seq_len; }
  // The first key the query rows from position `row` of sequence b (and so every later row)
  // attend to, rounded down to the layout's key step: 0, or with a window its first key's.
  std::int64_t first_key(std::int64_t b, std::int64_t row) const noexcept;
  // The chunks of split_keys keys at most that sequence b's split makes of the keys its rows read
  // (from first_key(b, 0)); chunks_ is the largest over the batch.
  std::int64_t key_chunks(std::int64_t b) const noexcept;
  // Keys per chunk of sequence b's split (a multiple of the layout's key step).
  std::int64_t chunk_keys(std::int64_t b) const noexcept;
  float* partial(std::int64_t b, std::int64_t g, std::int64_t chunk) const noexcept;
  // Partial results per (b, g): chunks times pieces.
  std::int64_t partials_per_head() const noexcept { return chunks_ * pieces_; }
  // Task t's rows of its partial result: zeros, a maximum of -inf and a sum of 0 (it has no key).
  void empty_partial(const attention_task& t) const noexcept;

  const isa_kernels& kernels_;
  const attention_args& args_;
  attention_layout layout_;
  std::int64_t chunks_ = 1;  // key chunks per head (1: no split)
  // A ring (kv_store::ring): each task's keys in at most two pieces, before and after the
  // ring's wrap (a multiple of its slots), each over the slots in key order with the rows'
  // positions shifted by the piece's base (its first key's slot is its position - base), and
  // merged as a split's chunks are. 1 otherwise.
  std::int64_t pieces_ = 1;
  std::int64_t per_head_ = 1;  // tasks per K/V head: query blocks, or chunks, times pieces_
  // With a split or a ring: per (b, g, chunk or block, piece), seq_len * group rows of head_dim
  // + 2 floats, written by tasks (a block's tasks its own rows).
  mutable float_buffer partials_;
  // With bf16 results (attention_args::out16): one fp32 row per merge, rounded when done.
  mutable float_buffer merged_;
};

// Every step of `args`, in order, on the calling thread, with the kernels' layout for key_tile
// (0: the schedule's default). Throws std::bad_alloc.
void attention(const isa_kernels& kernels, const attention_args& args, std::int64_t key_tile = 0);

// Bytes of one (sequence, K/V head) of a KV cache of `capacity` tokens: a packed head with
// kv_rows = capacity, in the layout of `kernels` for a cache of `kv` (bf16: pairs; int8, k8v4:
// codes)
// in a plan of bf16 operands or not.
std::int64_t cache_head_bytes(const isa_kernels& kernels, std::int64_t capacity,
                              std::int64_t head_dim, bool bf16_operands, precision kv) noexcept;

}  // namespace mha::detail
