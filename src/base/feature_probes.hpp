// The features beyond fp32 multi-head attention that `mha backends` and the Python package's
// Backend.declines() ask each backend about, one small problem each, and the answers.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "mha/backend.hpp"
#include "mha/problem.hpp"

namespace mha::detail {

inline std::vector<std::pair<const char*, problem>> feature_probes() {
  problem base;
  base.cfg = {.d_in = 64, .d_out = 64, .n_heads = 8, .context_length = 16};
  problem grouped = base, bf16 = base, decode = base, window = base;
  grouped.cfg.n_kv_heads = 2;
  bf16.cfg.precision = precision::bf16;
  decode.past = 8;
  window.cfg.window = 4;
  return {{"grouped-query", grouped}, {"bf16", bf16}, {"decode", decode}, {"window", window}};
}

// A feature's answer: the formulations `b` declines it in (in formulations()' order) and why;
// empty when it computes the feature in every one.
using feature_declines = std::vector<std::pair<formulation, std::string>>;

// Every feature of feature_probes(), in order, with `b`'s answer.
inline std::vector<std::pair<const char*, feature_declines>> declines(const backend& b) {
  std::vector<std::pair<const char*, feature_declines>> out;
  for (const auto& [feature, probe] : feature_probes()) {
    feature_declines reasons;
    for (formulation form : formulations()) {
      problem p = probe;
      p.form = form;
      if (const support s = b.supports(p); !s) reasons.emplace_back(form, s.reason());
    }
    out.emplace_back(feature, std::move(reasons));
  }
  return out;
}

}  // namespace mha::detail
