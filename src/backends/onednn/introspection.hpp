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

}  // namespace mha::detail
