// Internal: what the oneDNN backend's primitives are, for tests (not part of the public API).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "mha/backend.hpp"

namespace mha::detail {

// One line per primitive that p runs for input shape (batch, seq_len), as "<step> <implementation
// name>", e.g. "projection brg:avx512_core", "scores gemm:jit". Builds (and caches) the
// primitives when p has not run that shape yet. Throws mha::invalid_argument when p was not
// prepared by the oneDNN backend or the shape is out of range.
std::vector<std::string> onednn_implementations(const plan& p, std::int64_t batch,
                                                std::int64_t seq_len);

// The OpenMP team sizes p holds primitives for at input shape (batch, seq_len), most recently
// used first: one entry per run_options::threads value it ran the shape with (oneDNN fixes a
// primitive's thread partition when it is created). Same errors as onednn_implementations.
std::vector<int> onednn_cached_team_sizes(const plan& p, std::int64_t batch, std::int64_t seq_len);

}  // namespace mha::detail
