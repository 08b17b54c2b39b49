// The oracle: the spec of DESIGN §1 computed in double, straight from the split-weight formulas.
// Not a backend; tests compare every backend with it.
#pragma once

#include <cstdint>
#include <vector>

#include "mha/config.hpp"
#include "mha/run_options.hpp"
#include "mha/weights.hpp"

namespace mha_test {

// y (batch, seq_len, d_out) for x (batch, seq_len, d_in). In training mode applies the shared
// dropout mask (options.seed, config dropout p), so it matches backends in training mode too.
std::vector<double> reference_forward(const mha::config& cfg, const mha::weights& w,
                                      const std::vector<float>& x, std::int64_t batch,
                                      std::int64_t seq_len, const mha::run_options& options = {});

}  // namespace mha_test
