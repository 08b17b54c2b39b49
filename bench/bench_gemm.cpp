// bench_gemm: the xsimd GEMM (every ISA this CPU runs) next to oneDNN's matmul and OpenBLAS's
// sgemm, single-threaded, at the projection shapes of the benchmark presets:
//   C (M, N) = A (M, K) W^T, W an nn.Linear weight (N, K) row-major, no bias.
// Every library gets its weights in its preferred layout outside the timed loop (our panels,
// oneDNN's reorder to the format its matmul asks for; OpenBLAS takes W as is), as a plan does
// in prepare(). Before timing, 64 sampled entries of C are checked against a double dot product.
// Counters: GFLOPS (2MNK per second) and pct_peak against the FP32 FMA peak of one core, of the
// ISA the kernel runs (mha::fma_peak_of).
//   bench_gemm [--isa NAME] [--benchmark_filter=...] [google benchmark flags]
// --isa runs the xsimd kernels of that ISA only and caps oneDNN to the same (kernel_timing.hpp).
#include <benchmark/benchmark.h>
#include <dlfcn.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "base/bf16.hpp"
#include "base/text.hpp"
#include "common/buffer.hpp"
#include "kernel_timing.hpp"
#include "kernels/interface/isa_kernels.hpp"
#include "mha/backends/xsimd.hpp"

#if MHA_BENCH_ONEDNN
#include <omp.h>

#include <oneapi/dnnl/dnnl.hpp>

#include "mha/backends/onednn.hpp"
#endif

namespace {

// FP32 FMA peaks of every ISA, measured at start-up by the suite's calibration loop.
mha_bench::fma_peak peaks;

// The one-core peak (GFLOP/s) of the FMA loop `loop` ("avx512", "avx2", "portable":
// mha::fma_peak_of the ISA a kernel runs on).
double peak_for(std::string_view loop) { return peaks.of(loop).gflops_one_core; }

struct shape {
  std::int64_t m, k, n;
  std::string name() const { return mha::detail::text("m", m, "/k", k, "/n", n); }
};

// The projections of the presets: Q/K/V and out_proj at d_model 768 (B*T = 1024 tokens), the
// fused QKV width, wrapper heads of head_dim 64 and 8, and the largest fixed-head_dim model
// (d_model 6144, 128 tokens).
const std::vector<shape> shapes = {
    {1024, 768, 768}, {1024, 768, 2304}, {1024, 768, 64}, {1024, 768, 8}, {128, 6144, 6144}};

struct operands {
  std::vector<float> a, w;  // A (m, k), W (n, k)
  std::vector<float> c;     // C (m, n)
  explicit operands(const shape& s) : a(s.m * s.k), w(s.n * s.k), c(s.m * s.n) {
    std::mt19937 gen(7);
    std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
    for (float& e : a) e = dist(gen);
    for (float& e : w) e = dist(gen);
  }
};

// 64 entries of C (including both corners) against a double dot product; empty when all match.
std::string check(const shape& s, const operands& o) {
  std::mt19937 gen(11);
  for (int sample = 0; sample < 64; ++sample) {
    const std::int64_t i = sample == 0 ? 0 : sample == 1 ? s.m - 1 : gen() % s.m;
    const std::int64_t j = sample == 0 ? 0 : sample == 1 ? s.n - 1 : gen() % s.n;
    double dot = 0.0, magnitude = 0.0;
    for (std::int64_t kk = 0; kk < s.k; ++kk) {
      dot += double{o.a[i * s.k + kk]} * o.w[j * s.k + kk];
      magnitude += std::abs(double{o.a[i * s.k + kk]} * o.w[j * s.k + kk]);
    }
    if (!(std::abs(o.c[i * s.n + j] - dot) <= 1e-5 * magnitude)) {
      return mha::detail::text("wrong result at C[", i, "][", j, "]");
    }
  }
  return {};
}

void run(benchmark::State& state, const shape& s, operands& o, std::string_view peak_loop,
         const std::function<void()>& gemm) {
  if (!mha_bench::check_then_time(
          state, gemm, [&] { return check(s, o); }, 2.0 * s.m * s.n * s.k * 1e-9,
          peak_for(peak_loop)))
    return;
  state.counters["M"] = static_cast<double>(s.m);
  state.counters["K"] = static_cast<double>(s.k);
  state.counters["N"] = static_cast<double>(s.n);
}

void bm_xsimd(benchmark::State& state, shape s, mha::isa isa) {
  operands o(s);
  const mha::detail::isa_kernels& kernels = mha::detail::kernels_for(isa);
  const mha::detail::packed_matrix w(o.w.data(), nullptr, s.n, s.k, kernels.panel_width(s.n));
  const mha::detail::panels_view b = w.view();
  state.SetLabel("panels of " + std::to_string(b.nr));
  run(state, s, o, mha::fma_peak_of(isa), [&] {
    kernels.gemm({o.a.data(), s.k, b, o.c.data(), s.n, s.m}, 0, s.m, 0, b.panels());
  });
}

// The bf16 GEMM of a bf16 plan's projections (A rounded to pairs in the timed call, as a plan
// does per call; W packed as pairs once), on the ISAs that multiply bf16 natively; checked
// against double products of the rounded operands, read against that ISA's bf16 peak. The pairs
// and C are 64-byte aligned, as a plan's scratch is (a misaligned tile row spans two lines).
void bm_xsimd_bf16(benchmark::State& state, shape s, mha::isa isa) {
  operands o(s);
  const mha::detail::isa_kernels& kernels = mha::detail::kernels_for(isa);
  const mha::detail::packed_matrix w(o.w.data(), nullptr, s.n, s.k, kernels.panel_width(s.n),
                                     /*bf16_pairs=*/true);
  const mha::detail::pair_panels_view b = w.pair_view();
  mha::detail::aligned_buffer<mha::detail::bf16_pair> a(static_cast<std::size_t>(s.m * b.k));
  mha::detail::float_buffer c(static_cast<std::size_t>(s.m * s.n));
  operands rounded = o;  // the reference's operands: A and W as bf16 sees them
  for (float& e : rounded.a) e = mha::detail::round_bf16(e);
  for (float& e : rounded.w) e = mha::detail::round_bf16(e);
  state.SetLabel("bf16 pairs, panels of " + std::to_string(b.nr));
  if (!mha_bench::check_then_time(
          state,
          [&] {
            kernels.to_pairs(o.a.data(), s.m, s.k, s.k, a.data());
            kernels.pair_gemm({a.data(), b.k, b, c.data(), s.n, s.m}, 0, s.m, 0, b.panels());
          },
          [&] {
            rounded.c.assign(c.data(), c.data() + s.m * s.n);
            return check(s, rounded);
          },
          2.0 * s.m * s.n * s.k * 1e-9, peaks.bf16_one_core(isa)))
    return;
}

#if MHA_BENCH_ONEDNN
void bm_onednn(benchmark::State& state, shape s) {
  using dnnl::memory;
  using tag = memory::format_tag;
  operands o(s);
  const dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  dnnl::stream stream(engine);
  const memory::desc a_md({s.m, s.k}, memory::data_type::f32, tag::ab);
  const memory::desc c_md({s.m, s.n}, memory::data_type::f32, tag::ab);
  // B = W^T: (k, n) with W's (n, k) row-major storage is format ba.
  const memory::desc w_md({s.k, s.n}, memory::data_type::f32, tag::ba);
  const memory::desc any_md({s.k, s.n}, memory::data_type::f32, tag::any);
  const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a_md, any_md, c_md), engine);
  memory w_user(w_md, engine, o.w.data()), w_packed(pd.weights_desc(), engine);
  dnnl::reorder(w_user, w_packed).execute(stream, w_user, w_packed);
  memory a(a_md, engine, o.a.data()), c(c_md, engine, o.c.data());
  const dnnl::matmul matmul(pd);
  state.SetLabel(pd.impl_info_str());
  run(state, s, o, mha::fma_peak_of(mha::onednn_backend().isa()), [&] {
    matmul.execute(stream, {{DNNL_ARG_SRC, a}, {DNNL_ARG_WEIGHTS, w_packed}, {DNNL_ARG_DST, c}});
    stream.wait();
  });
}
#endif

// OpenBLAS through its run-time library (libopenblas0, no -dev package needed); cblas_sgemm with
// the enums of cblas.h as ints.
struct openblas {
  using sgemm_fn = void (*)(int, int, int, int, int, int, float, const float*, int, const float*,
                            int, float, float*, int);
  sgemm_fn sgemm = nullptr;
  std::string config;

  static const openblas& get() {
    static const openblas instance = [] {
      openblas o;
      void* lib = dlopen("libopenblas.so.0", RTLD_NOW | RTLD_LOCAL);
      if (lib == nullptr) return o;
      auto set_threads = reinterpret_cast<void (*)(int)>(dlsym(lib, "openblas_set_num_threads"));
      auto get_config = reinterpret_cast<const char* (*)()>(dlsym(lib, "openblas_get_config"));
      o.sgemm = reinterpret_cast<sgemm_fn>(dlsym(lib, "cblas_sgemm"));
      if (set_threads != nullptr) set_threads(1);
      if (get_config != nullptr) o.config = get_config();
      return o;
    }();
    return instance;
  }
};

// OpenBLAS picks its own kernels (its config names them): read against the best peak.
std::string_view best_loop() { return peaks.best().isa; }

void bm_openblas(benchmark::State& state, shape s) {
  const openblas& blas = openblas::get();
  operands o(s);
  state.SetLabel(blas.config);
  constexpr int row_major = 101, no_trans = 111, trans = 112;  // CBLAS_ORDER, CBLAS_TRANSPOSE
  const int m = static_cast<int>(s.m), n = static_cast<int>(s.n), k = static_cast<int>(s.k);
  run(state, s, o, best_loop(), [&] {
    blas.sgemm(row_major, no_trans, trans, m, n, k, 1.0f, o.a.data(), k, o.w.data(), k, 0.0f,
               o.c.data(), n);
  });
}

}  // namespace

int main(int argc, char** argv) {
#if MHA_BENCH_ONEDNN
  omp_set_num_threads(1);  // oneDNN runs on OpenMP here (docs/dependencies.md §2)
#endif
  std::optional<mha_bench::fma_peak> measured =
      mha_bench::initialize(&argc, argv, "1 OpenMP thread");
  if (!measured) return 1;
  peaks = *measured;
  if (openblas::get().sgemm != nullptr)
    benchmark::AddCustomContext("openblas", openblas::get().config + ", 1 thread");

  for (const shape& s : shapes) {
    // Every ISA this CPU runs, or the one --isa / MHA_XSIMD_ISA names.
    const bool capped = std::getenv("MHA_XSIMD_ISA") != nullptr;
    for (mha::isa isa : mha::xsimd_supported_isas()) {
      if (capped && isa != mha::xsimd_default_isa()) continue;
      const std::string name = mha::detail::text("gemm/xsimd_", mha::to_string(isa), "/", s.name());
      benchmark::RegisterBenchmark(name.c_str(), bm_xsimd, s, isa)->UseRealTime();
      if (mha::native_bf16(isa)) {
        const std::string bf16 =
            mha::detail::text("gemm/xsimd_", mha::to_string(isa), "/bf16/", s.name());
        benchmark::RegisterBenchmark(bf16.c_str(), bm_xsimd_bf16, s, isa)->UseRealTime();
      }
    }
#if MHA_BENCH_ONEDNN
    benchmark::RegisterBenchmark(mha::detail::text("gemm/onednn/", s.name()).c_str(), bm_onednn, s)
        ->UseRealTime();
#endif
    if (openblas::get().sgemm != nullptr) {
      benchmark::RegisterBenchmark(mha::detail::text("gemm/openblas/", s.name()).c_str(),
                                   bm_openblas, s)
          ->UseRealTime();
    }
  }
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
