// Internal: the oneDNN backend's attention, on attention_steps (primitives.hpp).
#pragma once

#include "backends/onednn/primitive_cache.hpp"
#include "driver/attention_args.hpp"
#include "driver/buffer.hpp"

namespace mha::detail {

// The attention of a full forward or, with a cache, of a decode call (docs/design.md §1.4: the
// new keys and values appended to the row-major cache, then each sequence's queries against
// its cached rows, read in place through strided descriptors and padded to a bucket of keys
// all sequences of the call share: key_bucket rebuilds primitives ~8 times per doubling of the
// context, not every step; the padding is zeroed and masked).
//
// A slice is one (b, g): the rows of K/V head g's query heads, stacked head after head (rows =
// kv_group * seq_len), against g's keys and values. Slices are taken `group` at a time along
// the axis their memory runs along: K/V heads within a sequence, or (the wrapper's per-head
// buffers, one head per K/V head) sequences within a head. When a slice's query rows are not
// one dense block (the wrapper with grouped K/V and batch > 1), they are copied into one first.
// Per group: scores (matmul with the scale and the mask fused), softmax in place and weights V
// (matmul) into a dense buffer, whose rows are then copied to the output's strided columns (the
// head merge). bf16: Q (and, without a cache, K and V) gathered by reorders into dense bf16
// slices first, the softmax weights rounded as attention_steps::run_group says, the cache held
// as bf16. Training mode applies dropout to the weights between softmax and V.
//
// Primitives come from (and are built into) `primitives`; buffers are one lease of `scratch`
// per call. Throws mha::error when oneDNN fails, mha::invalid_argument when the scores exceed
// max_score_bytes() (core/checks.hpp).
void onednn_attention(const attention_args& a, const primitive_caches& primitives,
                      const scratch_pool& scratch);

}  // namespace mha::detail
