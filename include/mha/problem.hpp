// mha: one forward-pass problem (module + formulation + input shape), its canonical name and
// its model FLOP count.
#pragma once

#include <cstdint>
#include <string>

#include "mha/config.hpp"

namespace mha {

// A module, the formulation it is computed in, and the input shape of one forward pass.
struct problem {
  config cfg;
  formulation form = formulation::split_weight;
  std::int64_t batch = 1;
  std::int64_t seq_len = 1;
};

// The canonical problem string, in the order benchmark names use it:
// "split_weight/b4/t256/din768/dout768/h12", followed by the non-default flags
// ("/noncausal", "/qkv_bias", "/no_out_proj").
std::string to_string(const problem& p);

// Model FLOPs of one forward pass (docs/design.md §3), as a double:
//   2*B*T*d_in*d_out*3                (Q, K, V projections)
// + 2*B*T*d_out*d_out                 (out_proj, when cfg.out_proj)
// + 4*B*H*head_dim*P                  (Q K^T and A V), P = T*(T+1)/2 causal, T*T otherwise.
// The same count for both formulations: they compute the same function.
double flops(const problem& p) noexcept;

}  // namespace mha
