// The features beyond fp32 multi-head attention that `mha backends` and the Python package's
// Backend.declines() ask each backend about, one small problem each.
#pragma once

#include <utility>
#include <vector>

#include "mha/problem.hpp"

namespace mha::detail {

inline std::vector<std::pair<const char*, problem>> feature_probes() {
  problem base;
  base.cfg = {.d_in = 64, .d_out = 64, .n_heads = 8, .context_length = 16};
  problem grouped = base, bf16 = base, decode = base;
  grouped.cfg.n_kv_heads = 2;
  bf16.cfg.precision = precision::bf16;
  decode.past = 8;
  return {{"grouped-query", grouped}, {"bf16", bf16}, {"decode", decode}};
}

}  // namespace mha::detail
