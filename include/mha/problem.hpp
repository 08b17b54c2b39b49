// mha: one forward-pass problem (module + formulation + input shape), its canonical name and
// its model FLOP count.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "mha/config.hpp"

namespace mha {

// A module, the formulation it is computed in, and the input shape of one call: `seq_len` new
// tokens per sequence, after `past` tokens whose keys and values a cache already holds
// (past = 0: a full forward pass; past > 0, usually with seq_len = 1: a decode step,
// docs/design.md §1.4), kept in a cache of `kv_precision` (§1.7; nullopt: the plan's own).
struct problem {
  config cfg;
  formulation form = formulation::split_weight;
  std::int64_t batch = 1;
  std::int64_t seq_len = 1;
  std::int64_t past = 0;
  std::optional<precision> kv_precision = std::nullopt;
  bool operator==(const problem&) const = default;

  // The format of the cache's keys and values: kv_precision, else the plan's precision.
  mha::precision cache_precision() const noexcept { return kv_precision.value_or(cfg.precision); }
};

// The canonical problem string: the grammar every problem name follows (benchmark names,
// result files, the report, the peers; docs/design.md and bench/README.md point here):
//   <formulation>/b<B>/t<T>[/past<P>]/din<d_in>/dout<d_out>/h<H>[/kvh<K>][/rope<base>]
//   [/rope_<scaling>][/w<W>][/cap<C>][/sinks][/noncausal][/qkv_bias][/no_out_proj][/no_out_bias][/out<N>]
//   [/qknorm<eps>][/<precision>][/kv_<precision>]
// with the bracketed parts only when not the default: past 0, kv_heads() == n_heads, no rotary
// embedding (rope_base 0), no rotary scaling (<scaling> as mha::rope_scaling_name spells it:
// linear4, llama3_8_1_4_8192, yarn_32_32_1_4096_0_1), no sliding window (config::window 0), no
// soft-capping (cap<C>: config::softcap, a decimal number), no sinks (config::sinks), causal, no
// qkv bias, out_proj,
// out_proj with its bias (no_out_bias only with an out_proj), out_proj keeping d_out features
// (out<N>: config::out_features), no q/k norms (qknorm<eps>: config::qk_norm with its epsilon,
// a decimal number), precision fp32 (<precision> is its
// name: bf16), a cache in the plan's precision (kv_int8, kv_k8v4; kv_fp32 or kv_bf16 only when it
// differs from the plan's). Counts are decimal digits; the base is a decimal number, written in
// std::to_chars' shortest form: "split_weight/b4/t256/din768/dout768/h12",
// "fused_qkv/b1/t1/past1023/din4096/dout4096/h32/kvh8/rope5e+05/no_out_bias/bf16".
// The parts' order, spelling and defaults are one table in src/core/problem.cpp, which
// tools/mhapy/problem.py mirrors.
std::string to_string(const problem& p);

// The inverse of to_string(problem) for any order of the parts after the formulation, each at
// most once, default values spelled out or not ("fp32", "kvh<H>", "past0", "kv_fp32" of an fp32
// plan, which reads as kv_precision nullopt); the report's parser accepts the same grammar.
// context_length becomes past + seq_len, dropout 0. Throws
// mha::invalid_argument naming the part it cannot read, a part given twice or a required part
// missing.
problem parse_problem(std::string_view name);

// Model FLOPs of one call (docs/design.md §3), as a double, with d_kv = kv_heads * head_dim:
//   2*B*T*d_in*(d_out + 2*d_kv)       (Q, K, V projections of the T new tokens)
// + 2*B*T*d_out*out_width()           (out_proj, when cfg.out_proj)
// + 4*B*H*head_dim*P                  (Q K^T and A V), P the (query, key) pairs attended:
//                                     T*past + T*(T+1)/2 causal, T*(past+T) otherwise;
//                                     with a sliding window w, the sum of min(a + 1, w) over
//                                     the query positions a = past .. past+T-1.
// The same count for every formulation and precision: they compute the same function.
double flops(const problem& p) noexcept;

}  // namespace mha
