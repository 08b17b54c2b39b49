// Internal: how the oneDNN backend slices one attention call into executions of its attention
// primitives, as plain numbers: plan_attention() is a pure function of the call's arguments
// (no oneDNN object, no data read), which attention.cpp then executes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "common/attention_args.hpp"

namespace mha::detail {

// The geometry of one attention_steps (primitives.hpp): `group` slices of `rows` queries over
// `keys` keys and values, each slice a (rows, head_dim) / (keys, head_dim) matrix with rows
// head_dim apart. Slices are dense and back to back by default (stride 0); a decode step reads
// its queries and the cached keys and values of one sequence's heads through their strides
// instead.
//
// Grouped K/V heads: a slice's rows are the queries of all the query heads that share its keys
// and values, stacked head after head, so row r is position r % positions.
struct attention_geometry {
  std::int64_t rows = 0;
  std::int64_t positions = 0;  // query positions per head (0: rows)
  std::int64_t keys = 0, head_dim = 0, group = 1;
  std::int64_t q_stride = 0;   // elements from one slice's queries to the next (0: rows * head_dim)
  std::int64_t kv_stride = 0;  // from one slice's keys (values) to the next (0: keys * head_dim)
  bool causal = true;
  float scale = 1.0f;
  // false: the causal mask of a full forward (rows == keys), built once; true: an additive
  // (rows, keys) mask passed to each run (a decode step's mask depends on the cached lengths).
  bool mask_per_run = false;
  // Q, K, V and P as bf16 (docs/design.md §1.5; strides count bf16 elements), scores and out
  // f32: the softmax runs on f32 scores, whose weights are then turned back into the
  // unnormalised P and rounded (attention_steps::run_group).
  bool bf16 = false;
  bool operator==(const attention_geometry&) const = default;
};

// Keys a decode step's attention primitives are built for: `keys` rounded up to a granule of
// 1/8 of its power of two (at least 64), at most `capacity`. A generation loop then builds new
// primitives about 8 times per doubling of its context rather than every step, and pads at
// most 1/8 of the keys (masked, and zeroed in the cache).
std::int64_t key_bucket(std::int64_t keys, std::int64_t capacity);

// The heads per execution of attention_steps out of `count` slices of (rows, keys) scores: the
// largest divisor of count whose group * rows * keys scores fit 256 KiB (at least 1), so they
// stay in L2 (1 MiB on Zen4) between the three primitives: budgets from 64 KiB to 4 MiB run alike,
// all heads at once far slower, one head per execution pays its overhead on short rows
// (measurements: docs/design.md §5.1).
std::int64_t attention_group(std::int64_t count, std::int64_t rows, std::int64_t keys);

// A tensor of `dims` read through `strides` (in elements), as a to_bf16 reorder reads it.
struct strided_dims {
  std::vector<std::int64_t> dims, strides;
  bool operator==(const strided_dims&) const = default;
};

// One attention call (attention_args, with or without a cache) as executions of one
// attention_steps. A slice is one (b, g): the rows of K/V head g's query heads, stacked head
// after head (rows = kv_group * seq_len), against g's keys and values. Slices are taken
// `geometry.group` at a time along the axis their memory runs along: K/V heads within a
// sequence, or (the wrapper's per-head buffers, one head per K/V head, no cache) sequences
// within a head:
//   for o < outer, for first = 0, group, 2 group, ... < inner:
//     the group of slices slice(o, first, 0 .. group - 1)
// With a cache the keys are padded to a bucket all sequences of the call share (key_bucket),
// the padding zeroed and masked.
struct attention_plan {
  // Where a group's queries are read from.
  enum class query_source {
    in_place,      // attention_args::q: the slices' rows are one block, q_slice apart
    copied,        // copied row by row into one dense f32 block first (the wrapper with
                   // grouped K/V and batch > 1: a slice's query heads are not one block)
    gathered_bf16  // rounded into one dense bf16 block by a reorder reading gather_q
  };
  // Where a group's keys and values are read from.
  enum class kv_source {
    projections,   // attention_args::k and v in place
    cache,         // the cache's rows in place (decode)
    gathered_bf16  // rounded into dense bf16 slices by a reorder reading gather_kv (bf16
                   // without a cache)
  };
  // A slice as (sequence, K/V head).
  struct slice_index {
    std::int64_t b, kv;
    bool operator==(const slice_index&) const = default;
  };

  attention_geometry geometry;  // the primitives: one execution per group of slices
  query_source queries = query_source::in_place;
  kv_source keys_values = kv_source::projections;
  // The slices of a group are sequences (of K/V head o), else K/V heads (of sequence o).
  bool over_batch = false;
  std::int64_t outer = 0, inner = 0;
  // Elements from one slice's queries to the next's in attention_args::q, and from one slice's
  // keys (values) to the next's in attention_args::k and v, or in the cache.
  std::int64_t q_slice = 0, kv_slice = 0;
  // The bf16 reorders' sources, one group's worth (gathered_bf16 only; empty otherwise).
  strided_dims gather_q, gather_kv;
  // Floats of a group's buffers besides its scores and the primitives' scratchpad (which the
  // built primitives size): dense outputs, the (rows, keys) mask (decode), staged queries (f32
  // copied or bf16 gathered), gathered bf16 keys and values. bf16 counts two per float.
  std::size_t out_floats = 0, mask_floats = 0, query_floats = 0, key_floats = 0, value_floats = 0;

  slice_index slice(std::int64_t o, std::int64_t first, std::int64_t s) const noexcept {
    return over_batch ? slice_index{first + s, o} : slice_index{o, first + s};
  }
};

// The plan of attention call `a` (a full forward, past 0, or a call with a cache), from its
// shape, strides, flags (causal, bf16, scale) and, with a cache, the cache's layout, capacity
// and lengths before the call. Reads no data. The OpenMP team size is not part of it:
// primitive_caches adds it to the key of the primitives the plan asks for.
attention_plan plan_attention(const attention_args& a);

}  // namespace mha::detail
