// mha::onednn: oneDNN's matmul and softmax primitives (link mha::onednn).
#pragma once

#include "mha/backend.hpp"

namespace mha {

// The oneDNN backend: every step is a oneDNN 2.x primitive (matmul with fused bias for the
// projections; a batched matmul with fused scale and causal mask for Q K^T; softmax; a batched
// matmul for A V), fp32. Its plans build the primitives of each (batch, seq_len) on first use and
// keep those of the most recent shapes; run() is const and safe to call from several threads at
// once. Threads: oneDNN runs on OpenMP; run_options::threads > 0 sets the calling thread's
// OpenMP team size for the duration of run() (restored afterwards), 0 leaves OpenMP's default
// (all cores unless OMP_NUM_THREADS says otherwise). Failures inside oneDNN are rethrown as
// mha::error naming the backend, the step and the problem.
const backend& onednn_backend();

}  // namespace mha
