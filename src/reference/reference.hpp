// The oracle: the spec of DESIGN §1 computed in double, straight from the split-weight formulas.
// Not a backend and not installed: tests compare every backend with it, the benchmark checks a
// sample of rows before timing, and `mha verify` reports errors against it.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "mha/config.hpp"
#include "mha/run_options.hpp"
#include "mha/weights.hpp"

namespace mha_reference {

// One output row: token `token` of batch element `batch`.
struct row {
  std::int64_t batch = 0, token = 0;
};

// y (batch, seq_len, d_out) for x (batch, seq_len, d_in), every row. In training mode applies
// the shared dropout mask (options.seed, cfg.dropout), so it matches backends there too.
std::vector<double> forward(const mha::config& cfg, const mha::weights& w, std::span<const float> x,
                            std::int64_t batch, std::int64_t seq_len,
                            const mha::run_options& options = {});

// Only the requested rows: result[r * d_out + e] is y[rows[r].batch][rows[r].token][e]. Costs
// O(seq_len * d_in * d_out) per distinct batch element plus O(seq_len * d_out) per row, so a few
// rows of a large problem are cheap to check.
std::vector<double> forward_rows(const mha::config& cfg, const mha::weights& w,
                                 std::span<const float> x, std::int64_t batch, std::int64_t seq_len,
                                 std::span<const row> rows, const mha::run_options& options = {});

}  // namespace mha_reference
