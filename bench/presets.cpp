// The presets (mha_bench --preset): the series each one sweeps, scaled to the thread count.
#include <array>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "mha/error.hpp"
#include "sweep.hpp"

namespace mha_bench {
namespace {

// GPT-2 small: the anchor shape of docs/design.md §5 and of the backend targets.
constexpr std::int64_t gpt2_d_model = 768, gpt2_heads = 12, gpt2_context = 1024;

constexpr std::array<std::string_view, 8> names = {"quick",  "heads",  "seq",   "threads",
                                                   "decode", "window", "cores", "full"};

std::vector<int> one_and_all(int hardware_threads) {
  if (hardware_threads == 1) return {1};
  return {1, hardware_threads};
}

std::vector<int> one_to_all(int hardware_threads) {
  std::vector<int> t;
  for (int n = 1; n <= hardware_threads; ++n) t.push_back(n);
  return t;
}

// H in the heads preset: divisors of 768 from 1 to 96, so both series have whole head_dims
// (down to 8 at d_model 768; up to d_model 6144 at head_dim 64).
const std::vector<std::int64_t> heads_axis = {1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96};

std::vector<series> quick(int hw) {
  // A first look in about a minute: split vs wrapper at five head counts of a GPT-2-wide
  // module (head_dim 768 down to 8, short sequence so the naive backend fits its budget), and
  // GPT-2 small at its full context, where backends differ most.
  return {{"quick_heads", {1}, {128}, {1, 4, 12, 48, 96}, {gpt2_d_model}, 0, one_and_all(hw)},
          {"gpt2_small", {1}, {gpt2_context}, {gpt2_heads}, {gpt2_d_model}, 0, one_and_all(hw)}};
}

std::vector<series> heads(int hw) {
  // Grouped-query attention at the fixed width: multi-head, groups of 4 and 8, multi-query, at
  // the H of the axis that 8 divides.
  series grouped{"heads_kv",     {4}, {256},          {8, 16, 24, 32, 48, 64, 96},
                 {gpt2_d_model}, 0,   one_and_all(hw)};
  grouped.kv_groups = {1, 4, 8, 0};
  return {{"heads_d_model", {4}, {256}, heads_axis, {gpt2_d_model}, 0, one_and_all(hw)},
          {"heads_head_dim", {1}, {128}, heads_axis, {}, 64, one_and_all(hw)},
          grouped};
}

std::vector<series> seq(int hw) {
  return {{"seq",
           {1},
           {64, 128, 256, 512, 1024, 2048, 4096},
           {gpt2_heads},
           {gpt2_d_model},
           0,
           one_and_all(hw)}};
}

std::vector<series> threads(int hw) {
  return {{"threads", {1}, {gpt2_context}, {gpt2_heads}, {gpt2_d_model}, 0, one_to_all(hw)}};
}

std::vector<series> decode(int hw) {
  // Generation: one new token per sequence over a cache of `past` tokens, GPT-2 small's width,
  // from a short prompt to a long context, for one sequence and for continuous batches.
  series s{"decode", {1, 8, 32}, {1}, {gpt2_heads}, {gpt2_d_model}, 0, one_and_all(hw)};
  s.past = {128, 512, 2048, 8192, 32768};
  // The same step with 3 K/V heads (groups of 4, 4x fewer cache bytes) and 1 (multi-query).
  series grouped{"decode_kv", {1, 8}, {1}, {gpt2_heads}, {gpt2_d_model}, 0, one_and_all(hw)};
  grouped.kv_heads = {3, 1};
  grouped.past = {2048, 8192, 32768};
  // The KV cache's precisions (docs/design.md §1.7): fp32 and bf16 plans, each with its own
  // cache and with an int8, a k8v4 and an int4 one, for one sequence over a long context and a
  // batch over a middle one (the fp32 points are the decode series').
  series cache{"decode_cache", {1, 32}, {1}, {gpt2_heads}, {gpt2_d_model}, 0, one_and_all(hw)};
  cache.past = {2048, 8192};
  cache.precisions = {mha::precision::fp32, mha::precision::bf16};
  cache.kv_precisions = {mha::precision::fp32, mha::precision::bf16, mha::precision::int8,
                         mha::precision::k8v4, mha::precision::int4};
  // Long contexts: one sequence over 32k and 128k cached tokens in each cache precision (the
  // fp32 cache of 128k tokens is 805 MB: it fits where mha runs).
  series long_context = cache;
  long_context.name = "decode_long";
  long_context.batch = {1};
  long_context.past = {32768, 131072};
  // A Llama-3-8B-like step (d_model 4096, 32 query heads of 128 dimensions over 8 K/V heads):
  // the 4 query heads of a K/V head read its cache together (on AMX, a tile's rows), fp32 and
  // bf16 plans with their own caches.
  series llama{"decode_gqa", {1, 8}, {1}, {32}, {4096}, 0, one_and_all(hw)};
  llama.kv_heads = {8};
  llama.past = {8192};
  llama.precisions = {mha::precision::fp32, mha::precision::bf16};
  // Speculative decoding's verification: T = 1, 2, 4, 8, 16 new tokens per sequence (T - 1
  // drafted ones and the last accepted one, causal bottom-right) over 2k to 32k cached tokens,
  // one sequence, and 8 sequences over 8k: the fp32 plan with each cache it keeps in fp32, int8,
  // k8v4 and int4, the bf16 plan with its bf16 cache. The report holds each T-token step against
  // the one-token step (the acceptance a drafter must reach for it to pay).
  series verify{"decode_verify", {1}, {1, 2, 4, 8, 16}, {gpt2_heads},
                {gpt2_d_model},  0,   one_and_all(hw)};
  verify.past = {2048, 8192, 32768};
  verify.kv_precisions = {mha::precision::fp32, mha::precision::int8, mha::precision::k8v4,
                          mha::precision::int4};
  series verify_bf16 = verify;
  verify_bf16.name = "decode_verify_bf16";
  verify_bf16.precisions = {mha::precision::bf16};
  verify_bf16.kv_precisions = {mha::precision::bf16};
  series verify_batch = verify;
  verify_batch.name = "decode_verify_batch";
  verify_batch.batch = {8};
  verify_batch.past = {8192};
  return {s, grouped, cache, long_context, llama, verify, verify_bf16, verify_batch};
}

std::vector<series> window(int hw) {
  // Sliding windows (docs/design.md §1.9) beside plain causal attention (window 0) at GPT-2
  // small's width: prefill of one sequence of 4k to 32k tokens, where a window of w costs
  // O(T w) against causal's O(T^2), and a decode step over as many cached tokens, where it reads
  // w keys whatever the context. A window of 4,096 over 4,096 positions is causal: dropped.
  series prefill{"window",       {1}, {4096, 8192, 16384, 32768}, {gpt2_heads}, {gpt2_d_model}, 0,
                 one_and_all(hw)};
  prefill.window = {0, 512, 4096};
  series step{"window_decode", {1}, {1}, {gpt2_heads}, {gpt2_d_model}, 0, one_and_all(hw)};
  step.past = {4096, 8192, 16384, 32768};
  step.window = {0, 512, 4096};
  return {prefill, step};
}

std::vector<series> cores(int hw) {
  // Scaling past two cores: GPT-2 small's prefill for one sequence and four (a larger grid of
  // tasks), and decode over 8192 cached tokens for 1, 8 and 32 sequences (one sequence has 12
  // heads of work: only the split over keys feeds more threads) and with 3 K/V heads.
  const std::vector<int> t = doubling_to_all(hw);
  series prefill{"cores_prefill", {1, 4}, {gpt2_context}, {gpt2_heads}, {gpt2_d_model}, 0, t};
  series step{"cores_decode", {1, 8, 32}, {1}, {gpt2_heads}, {gpt2_d_model}, 0, t};
  step.past = {8192};
  series grouped{"cores_decode_kv", {1, 8}, {1}, {gpt2_heads}, {gpt2_d_model}, 0, t};
  grouped.kv_heads = {3};
  grouped.past = {8192};
  return {prefill, step, grouped};
}

}  // namespace

std::vector<int> doubling_to_all(int hardware_threads) {
  std::vector<int> t;
  for (int n = 1; n < hardware_threads; n *= 2) t.push_back(n);
  t.push_back(hardware_threads);
  return t;
}

std::span<const std::string_view> preset_names() noexcept { return names; }

std::vector<series> preset(std::string_view name, int hardware_threads) {
  if (hardware_threads < 1) {
    throw mha::invalid_argument("mha_bench: hardware_threads (" + std::to_string(hardware_threads) +
                                ") must be >= 1");
  }
  if (name == "quick") return quick(hardware_threads);
  if (name == "heads") return heads(hardware_threads);
  if (name == "seq") return seq(hardware_threads);
  if (name == "threads") return threads(hardware_threads);
  if (name == "decode") return decode(hardware_threads);
  if (name == "window") return window(hardware_threads);
  if (name == "cores") return cores(hardware_threads);
  if (name == "full") {
    std::vector<series> all;
    for (auto part : {quick, heads, seq, threads, decode, window, cores}) {
      for (series& s : part(hardware_threads)) all.push_back(std::move(s));
    }
    return all;
  }
  throw mha::invalid_argument("mha_bench: unknown preset '" + std::string(name) +
                              "'; expected one of " +
                              join(std::vector<std::string>(names.begin(), names.end()), ", "));
}

}  // namespace mha_bench
