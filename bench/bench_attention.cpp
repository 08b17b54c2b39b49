// bench_attention: the attention core alone (Q, K, V given; causal; no projections), the figure
// to hold against other CPU flash-attention kernels:
//   out[b, h] = softmax(Q K^T / sqrt(head_dim) + causal mask) V, every (b, h),
// Q, K, V and out (B, H, T, head_dim) dense row-major, at (B, T, H, head_dim) = (1, 1024, 12, 64),
// (1, 4096, 12, 64), (1, 256, 96, 8), a sliding window of 512 over (1, 8192, 12, 64) and plain
// causal attention over (1, 512, 12, 64), on 1 and 2 threads (and every core when more):
//   fused    the xsimd kernel with online softmax over key tiles (what the tbb and xsimd backends
//            run), parallel over (b, h, 64-query block) tasks with the TBB framework;
//   unfused  the same kernel with one key tile per row: each query block's whole rows of scores
//            (64 x T floats), softmax, then P V;
//   fused_bf16  the fused kernel of a bf16 module (docs/design.md §1.5): Q, K, V and P rounded to
//            bf16, products summed in fp32 (vdpbf16ps where the CPU has AVX512_BF16), read
//            against the bf16 dot-product peak there and the FMA peak elsewhere;
//   onednn   oneDNN's batched matmul (scale and causal mask fused) + softmax + batched matmul
//            over groups of heads whose scores fit 256 KiB (the onednn backend's steps), threads
//            through OpenMP.
// Before timing, sampled rows (first and last batch element and head, tokens 0, T/3, 2T/3, T-1)
// are checked against the double oracle (mha_reference::attention_row).
// Counters: GFLOPS on causal pairs, 4 B H head_dim P with P = T (T + 1) / 2 (docs/design.md §3),
// and pct_peak against threads x the measured FP32 FMA peak of one core, of the ISA the kernel
// runs.
// And a decode step's attention alone over a KV cache, per cache format:
//   decode_<fp32|bf16|int8|k8v4|int4>/b<B>/t<T>/past<P>/h12/hd64  T new tokens per sequence
//            (causal, bottom-right: new token i sees the P cached ones and new ones 0..i) through
//            mha::attention over an attention cache (mha::make_attention_cache) holding P tokens,
//            on the tbb backend, rolled back after each step (kv_cache::truncate); T = 1, 2, 4,
//            8, 16 at (B, P) = (1, 2k), (1, 8k), (1, 32k), (8, 8k) (T > 1: a speculative
//            decoder's verification step, whose time over T = 1's is what the drafter's
//            accepted tokens must pay for), and T = 1 at (1, 128k) and (32, 2k). Checked
//            against the naive backend's cache of the same format fed the same step. Counters:
//            the cache's bytes per step over
//            the time (GBps; key and value rows as the format keeps them, docs/design.md §1.7) and
//            pct_read against the streaming read measured at that thread count
//            (machine/stream_read.hpp): a step over a cache beyond the L3 runs at most at 100.
//   bench_attention [--isa NAME] [--benchmark_filter=...] [google benchmark flags]
// --isa caps the xsimd kernels and oneDNN to the same ISA (kernel_timing.hpp).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "backends/tbb/parallel.hpp"
#include "base/text.hpp"
#include "cache_bytes.hpp"
#include "kernel_timing.hpp"
#include "kernels/interface/isa_kernels.hpp"
#include "machine/stream_read.hpp"
#include "mha/attention.hpp"
#include "mha/backends/naive.hpp"
#include "mha/backends/tbb.hpp"
#include "mha/backends/xsimd.hpp"
#include "mha_testing.hpp"
#include "reference.hpp"

#if MHA_BENCH_ONEDNN
#include <omp.h>

#include "backends/onednn/attention_plan.hpp"
#include "backends/onednn/primitives.hpp"
#include "mha/backends/onednn.hpp"
#endif

namespace {

using mha::detail::text;

mha_bench::fma_peak peaks;  // FP32 FMA peaks of every ISA, measured at start-up

// The one-core peak (GFLOP/s) for kernels dispatched to `isa`, with
// fp32 or bf16 operands.
double peak_for(mha::isa isa, bool bf16 = false) {
  return bf16 ? peaks.bf16_one_core(isa) : peaks.of(mha::fma_peak_of(isa)).gflops_one_core;
}

struct shape {
  std::int64_t batch, seq_len, heads, head_dim;
  std::int64_t window = 0;  // a sliding window (docs/design.md §1.9); 0: plain causal

  std::string name() const {
    return text("b", batch, "/t", seq_len, "/h", heads, "/hd", head_dim,
                window > 0 ? text("/w", window) : std::string());
  }
  std::int64_t size() const { return batch * heads * seq_len * head_dim; }
  // The pairs each row attends to, counted: T (T + 1) / 2 causal, sum_i min(i + 1, w) in a
  // window (the O(T w) law: only the multiply-adds inside each row's window count).
  double gflop() const {
    const double t = static_cast<double>(seq_len);
    double pairs = 0.5 * t * (t + 1);
    if (window > 0 && window < seq_len) {
      const double w = static_cast<double>(window);
      pairs = 0.5 * w * (w + 1) + (t - w) * w;
    }
    return 4.0 * static_cast<double>(batch * heads * head_dim) * pairs * 1e-9;
  }
};

// GPT-2's head shape at 1k and 4k, 96 narrow heads; a window of 512 over 8k beside plain causal
// attention over 512 (the window's rows each read as many keys as that call's last).
const std::vector<shape> shapes = {{1, 1024, 12, 64},
                                   {1, 4096, 12, 64},
                                   {1, 256, 96, 8},
                                   {1, 8192, 12, 64, 512},
                                   {1, 512, 12, 64}};

// Q, K, V uniform in [-1, 1) (K scaled up so the softmax is not flat), out, and the oracle's
// sampled rows.
struct operands {
  explicit operands(const shape& s) : q(s.size()), k(s.size()), v(s.size()), out(s.size()) {
    fill(q, 1, 1.0f);
    fill(k, 2, 3.0f);
    fill(v, 3, 1.0f);
  }

  static void fill(std::vector<float>& x, std::uint32_t seed, float scale) {
    std::uint32_t state = seed;
    for (float& e : x) {
      state = state * 1664525u + 1013904223u;  // LCG: reproducible, fast for 50M floats
      e = scale * (static_cast<float>(state >> 8) / 8388608.0f - 1.0f);
    }
  }

  std::vector<float> q, k, v, out;
};

// max |out - oracle| over the sampled rows, relative to the largest oracle value; a message
// when it exceeds the tolerance (float accumulation over up to 4096 keys stays far below 1e-5;
// bf16 operands within 2^-6 of the fp32 oracle here, docs/design.md §1.5).
std::string check(const shape& s, const operands& o, double tolerance) {
  mha_reference::attention_shape a{s.batch, s.heads, s.seq_len, s.head_dim};
  a.window = s.window;
  double error = 0.0, largest = 0.0;
  for (const std::int64_t b : {std::int64_t{0}, s.batch - 1}) {
    for (const std::int64_t h : {std::int64_t{0}, s.heads / 2, s.heads - 1}) {
      for (const std::int64_t i :
           {std::int64_t{0}, s.seq_len / 3, 2 * s.seq_len / 3, s.seq_len - 1}) {
        const std::vector<double> expected =
            mha_reference::attention_row(a, o.q, o.k, o.v, b, h, i);
        const float* got = o.out.data() + ((b * s.heads + h) * s.seq_len + i) * s.head_dim;
        for (std::int64_t e = 0; e < s.head_dim; ++e) {
          const double d = std::abs(got[e] - expected[e]);
          if (std::isnan(d) || d > error) error = std::isnan(error) ? error : d;  // NaN sticks
          largest = std::max(largest, std::abs(expected[e]));
        }
      }
    }
  }
  if (error <= tolerance * largest) return {};
  return text("wrong result: max error ", error, " > ", tolerance, " x max |reference| ", largest);
}

void run(benchmark::State& state, const shape& s, operands& o, int threads, double peak,
         double tolerance, const std::function<void()>& attention) {
  if (!mha_bench::check_then_time(
          state, attention, [&] { return check(s, o, tolerance); }, s.gflop(), peak, threads))
    return;
  state.counters["B"] = static_cast<double>(s.batch);
  state.counters["T"] = static_cast<double>(s.seq_len);
  state.counters["H"] = static_cast<double>(s.heads);
  state.counters["head_dim"] = static_cast<double>(s.head_dim);
  state.counters["n_threads"] = threads;
}

// The xsimd kernel through the TBB framework, key_tile as the layout takes it (seq_len: one tile
// per row, the unfused form), in fp32 or with bf16 operands.
void bm_xsimd(benchmark::State& state, shape s, int threads, std::int64_t key_tile, bool bf16) {
  operands o(s);
  const mha::detail::isa_kernels& kernels = mha::detail::kernels_for(mha::xsimd_default_isa());
  mha::detail::attention_args args;
  const std::int64_t head_stride = s.seq_len * s.head_dim, batch_stride = s.heads * head_stride;
  args.q = {o.q.data(), batch_stride, head_stride, s.head_dim};
  args.k = {o.k.data(), batch_stride, head_stride, s.head_dim};
  args.v = {o.v.data(), batch_stride, head_stride, s.head_dim};
  args.out = {o.out.data(), batch_stride, head_stride, s.head_dim};
  args.batch = s.batch;
  args.heads = s.heads;
  args.seq_len = s.seq_len;
  args.head_dim = s.head_dim;
  args.scale = 1.0f / std::sqrt(static_cast<float>(s.head_dim));
  args.bf16 = bf16;
  args.window = s.window;
  const mha::detail::attention_layout layout = kernels.layout(
      {.seq_len = s.seq_len, .keys = s.seq_len, .head_dim = s.head_dim, .key_tile = key_tile});
  state.SetLabel(text("key tile ", std::min(layout.key_tile, s.seq_len), ", ", kernels.arch_name));
  run(state, s, o, threads, peak_for(mha::xsimd_default_isa(), bf16), bf16 ? 1.0 / 64 : 1e-5, [&] {
    mha::detail::run_in({.threads = threads},
                        [&] { mha::detail::parallel_attention(kernels, args, key_tile); });
  });
}

#if MHA_BENCH_ONEDNN
void bm_onednn(benchmark::State& state, shape s, int threads) {
  operands o(s);
  const dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  dnnl::stream stream(engine);
  const std::int64_t slices = s.batch * s.heads,
                     group = mha::detail::attention_group(slices, s.seq_len, s.seq_len);
  const mha::detail::attention_steps steps(
      engine, {.rows = s.seq_len,
               .keys = s.seq_len,
               .head_dim = s.head_dim,
               .group = group,
               .causal = true,
               .scale = 1.0f / std::sqrt(static_cast<float>(s.head_dim))});
  std::vector<float> scores(steps.score_floats());
  std::vector<std::byte> scratchpad(steps.scratchpad_bytes());
  std::vector<std::string> implementations;
  steps.describe(implementations);
  std::string label = text(group, " heads per execution");
  for (const std::string& i : implementations) label += ", " + i;
  state.SetLabel(label);
  omp_set_num_threads(threads);  // oneDNN runs on OpenMP here (docs/dependencies.md §2)
  run(state, s, o, threads, peak_for(mha::onednn_backend().isa()), 1e-5, [&] {
    for (std::int64_t first = 0; first < slices; first += group) {
      const std::int64_t at = first * s.seq_len * s.head_dim;
      steps.run_group(stream, o.q.data() + at, o.k.data() + at, o.v.data() + at, o.out.data() + at,
                      scores.data(), scratchpad.data(), [](float*) {});
    }
    stream.wait();
  });
}
#endif

// ---- a decode step's attention over a KV cache ----

struct decode_shape {
  std::int64_t batch, rows, past, heads = 12, head_dim = 64;  // rows: new tokens per sequence

  std::string name() const {
    return text("b", batch, "/t", rows, "/past", past, "/h", heads, "/hd", head_dim);
  }
};

// 1, 2, 4, 8 and 16 new tokens per sequence (more than one: a speculative decoder's drafted
// tokens to verify) for one sequence over 2k, 8k and 32k cached tokens and for 8 over 8k; one
// new token for one sequence over 128k (a cache beyond a 2-vCPU VM's L3 share: 170-805 MB) and
// for 32 over 2k.
const std::vector<decode_shape> decode_shapes = [] {
  std::vector<decode_shape> steps;
  for (const auto& [batch, past] : {std::pair{1, 2048}, {1, 8192}, {1, 32768}, {8, 8192}})
    for (const std::int64_t rows : {1, 2, 4, 8, 16}) steps.push_back({batch, rows, past});
  steps.push_back({1, 1, 131072});
  steps.push_back({32, 1, 2048});
  return steps;
}();

// The streaming read at `threads` threads, GB/s, measured once per thread count.
double stream_read_gbps(int threads) {
  static std::vector<double> measured;
  if (measured.size() <= static_cast<std::size_t>(threads)) measured.resize(threads + 1, 0.0);
  if (measured[threads] == 0.0)
    measured[threads] = mha_bench::measure_stream_read(threads, 2).gbps_all_cores;
  return measured[threads];
}

void bm_decode(benchmark::State& state, decode_shape s, mha::precision kv, int threads) {
  const mha::precision compute = kv == mha::precision::bf16 ? kv : mha::precision::fp32;
  const std::int64_t rows = s.batch * s.rows * s.heads * s.head_dim;
  operands o({s.batch, s.rows, s.heads, s.head_dim});
  const auto caches = [&](const mha::backend& backend) {
    mha::kv_cache cache = mha::make_attention_cache(backend, s.batch, s.past + s.rows, s.heads,
                                                    s.head_dim, kv, compute);
    mha_testing::hold_zero_tokens(cache, s.past);  // the bytes of s.past tokens, read as codes
    return cache;
  };
  mha::kv_cache cache = caches(mha::tbb_backend()), naive = caches(mha::naive_backend());
  mha::attention_options options;
  options.causal = true;
  options.alignment = mha::causal_alignment::bottom_right;  // after the P held
  options.precision = compute;
  options.threads = threads;
  const auto step = [&](const mha::backend& backend, mha::kv_cache& c, float* out) {
    const auto view = [&](auto* data) {
      return mha::heads_view<std::remove_pointer_t<decltype(data)>>::dense(data, s.batch, s.heads,
                                                                           s.rows, s.head_dim);
    };
    mha::attention(backend, view(static_cast<const float*>(o.q.data())),
                   view(static_cast<const float*>(o.k.data())),
                   view(static_cast<const float*>(o.v.data())), c, view(out), options);
    for (std::int64_t b = 0; b < s.batch; ++b) c.truncate(b, s.past);
  };
  std::vector<float> want(static_cast<std::size_t>(rows));
  step(mha::naive_backend(), naive, want.data());
  state.SetLabel(text(mha::to_string(kv), " cache, tbb, ", mha::tbb_backend().description()));
  const double bytes = mha_bench::cache_token_bytes(kv, s.head_dim) *
                       static_cast<double>(s.batch * (s.past + s.rows) * s.heads);
  mha_bench::check_then_time(
      state, [&] { step(mha::tbb_backend(), cache, o.out.data()); },
      [&] {
        double error = 0.0, largest = 0.0;
        for (std::int64_t i = 0; i < rows; ++i) {
          error = std::max(error, static_cast<double>(std::abs(o.out[i] - want[i])));
          largest = std::max(largest, static_cast<double>(std::abs(want[i])));
        }
        const double tolerance = kv == mha::precision::bf16 ? 1.0 / 128 : 1e-3;
        if (error <= tolerance * largest) return std::string();
        return text("wrong result: max error ", error, " > ", tolerance, " x max |naive| ",
                    largest);
      },
      0.0, 1.0, threads);
  state.counters.erase("GFLOPS");
  state.counters.erase("pct_peak");
  state.counters["GBps"] =
      benchmark::Counter(bytes * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["pct_read"] = benchmark::Counter(bytes * 1e-9 * 100.0 / stream_read_gbps(threads),
                                                  benchmark::Counter::kIsIterationInvariantRate);
  state.counters["n_threads"] = threads;
}

}  // namespace

int main(int argc, char** argv) {
  std::optional<mha_bench::fma_peak> measured = mha_bench::initialize(&argc, argv, "OpenMP");
  if (!measured) return 1;
  peaks = *measured;

  std::vector<int> thread_counts = {1, 2};
  if (mha::detail::default_threads() > 2) thread_counts.push_back(mha::detail::default_threads());
  for (const shape& s : shapes) {
    for (const int threads : thread_counts) {
      const std::string suffix = text("/", s.name(), "/threads:", threads);
      benchmark::RegisterBenchmark(("attention/fused" + suffix).c_str(), bm_xsimd, s, threads,
                                   mha::detail::default_key_tile, false)
          ->UseRealTime()
          ->Unit(benchmark::kMillisecond);
      benchmark::RegisterBenchmark(("attention/fused_bf16" + suffix).c_str(), bm_xsimd, s, threads,
                                   mha::detail::default_key_tile, true)
          ->UseRealTime()
          ->Unit(benchmark::kMillisecond);
      if (s.window > 0) continue;  // the unfused form and oneDNN have no window
      benchmark::RegisterBenchmark(("attention/unfused" + suffix).c_str(), bm_xsimd, s, threads,
                                   s.seq_len, false)
          ->UseRealTime()
          ->Unit(benchmark::kMillisecond);
#if MHA_BENCH_ONEDNN
      benchmark::RegisterBenchmark(("attention/onednn" + suffix).c_str(), bm_onednn, s, threads)
          ->UseRealTime()
          ->Unit(benchmark::kMillisecond);
#endif
    }
  }
  for (const decode_shape& s : decode_shapes) {
    for (const mha::precision kv : mha::cache_precisions) {
      for (const int threads : thread_counts) {
        const std::string name =
            text("attention/decode_", mha::to_string(kv), "/", s.name(), "/threads:", threads);
        benchmark::RegisterBenchmark(name.c_str(), bm_decode, s, kv, threads)
            ->UseRealTime()
            ->Unit(benchmark::kMillisecond);
      }
    }
  }
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
