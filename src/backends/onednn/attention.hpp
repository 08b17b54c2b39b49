// Internal: the oneDNN backend's attention, executing plan_attention()'s plan
// (attention_plan.hpp) on attention_steps (primitives.hpp).
#pragma once

#include "backends/onednn/primitive_cache.hpp"
#include "common/attention_args.hpp"
#include "common/buffer.hpp"

namespace mha::detail {

// The attention of a full forward or, with a cache, of a decode call (docs/design.md §1.4: the
// new keys and values appended to the row-major cache, then each sequence's queries against
// its cached rows, read in place through strided descriptors and padded to the plan's bucket
// of keys; the padding is zeroed and masked).
//
// Per group of slices (attention_plan): its queries, keys and values read in place, copied or
// gathered as the plan says, then scores (matmul with the scale and the mask fused), softmax in
// place and weights V (matmul) into a dense buffer, whose rows are then copied to the output's
// strided columns (the head merge). bf16: Q (and, without a cache, K and V) gathered into dense
// bf16 slices, the softmax weights rounded as attention_steps::run_group says, the cache held
// as bf16. Training mode applies dropout to the weights between softmax and V.
//
// Primitives come from (and are built into) `primitives`; buffers are one lease of `scratch`
// per call. Throws mha::error when oneDNN fails, mha::invalid_argument when the scores exceed
// max_score_bytes() (base/checks.hpp).
void onednn_attention(const attention_args& a, const primitive_caches& primitives,
                      const scratch_pool& scratch);

}  // namespace mha::detail
