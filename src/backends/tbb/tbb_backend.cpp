// The TBB backend: the shared wrapper / split-weight drivers over the SIMD kernels (src/kernels),
// run in parallel by the framework of parallel.hpp inside one task arena per run.
#include <oneapi/tbb/version.h>

#include <algorithm>
#include <cassert>
#include <optional>

#include "backends/tbb/parallel.hpp"
#include "backends/tbb/task_trace.hpp"
#include "base/text.hpp"
#include "common/attention_calls.hpp"
#include "driver/isa_plan.hpp"
#include "kernels/xsimd_kernel_set.hpp"
#include "mha/backends/tbb.hpp"

namespace mha {
namespace {

// The xsimd kernel set of one ISA with its GEMM and attention in parallel, the driver's run()
// on the call's executor (a task arena of run_options::threads, or run_options::executor), and
// for_each (the wrapper's per-head projections, a decode step's sequences) as parallel tasks
// whose kernels nest on the same executor.
template <mha::isa Isa>
class tbb_kernel_set : public detail::xsimd_kernel_set<Isa> {
 public:
  using base = detail::xsimd_kernel_set<Isa>;
  using base::base;
  using typename base::packed_linear;

  void linear(const packed_linear& w, const float* x, std::int64_t rows, float* y) const {
    base::with_gemm_args(
        w, x, rows, y, [&](const auto& g) { detail::parallel_gemm(base::kernels(), g); },
        [](std::int64_t n, const auto& convert) {
          // x's rounding to pairs was a serial 10% of a 2-thread bf16 GPT-2 forward: its rows in
          // tasks of 64.
          const detail::phase_scope phase(detail::phase_kind::convert, 0);
          constexpr std::int64_t per_task = 64;
          detail::for_tasks((n + per_task - 1) / per_task, [&](std::int64_t i) {
            const detail::task_scope task;
            convert(i * per_task, std::min(n, (i + 1) * per_task));
          });
        });
  }
  std::optional<detail::head_view<const float>> project_heads(const packed_linear& w,
                                                              const float* x, std::int64_t batch,
                                                              std::int64_t seq_len,
                                                              std::int64_t heads, float* y) const {
    if (w.bf16()) return std::nullopt;
    const detail::head_major_gemm g{x, w.view(), y, batch, seq_len, heads};
    if (!g.applies()) return std::nullopt;
    detail::parallel_gemm(base::kernels(), g);
    return g.view();
  }
  static void attention(const detail::attention_args& args) {
    detail::parallel_attention(base::kernels(), args);
  }
  template <class F>
  static void run(const run_options& options, F&& f) {
    detail::run_in(options, f);
  }
  template <class F>
  static void for_each(std::int64_t n, F&& f) {
    const detail::phase_scope phase(detail::phase_kind::for_each, 0);
    detail::for_tasks(n, [&](std::int64_t i) {
      const detail::task_scope task;
      f(i);
    });
  }
};
static_assert(detail::kernel_set<tbb_kernel_set<isa::sse2>>);

class tbb_impl final : public backend, public detail::attention_calls {
 public:
  std::string_view name() const noexcept override { return "tbb"; }
  std::string description() const override {
    return detail::text("oneTBB ", TBB_VERSION_MAJOR, ".", TBB_VERSION_MINOR, " (",
                        detail::default_threads(), " threads) over ",
                        detail::kernels_description(detail::dispatched_isa()));
  }
  mha::isa isa() const override { return detail::dispatched_isa(); }
  // What the kernel set computes: grouped K/V heads, decode and bf16 (every ISA alike).
  support supports(const problem& p) const override {
    return detail::driver_support<tbb_kernel_set<isa::sse2>>(p);
  }
  int max_threads() const noexcept override { return detail::default_threads(); }
  // mha::attention: the plans' fused attention in parallel, fp32 or bf16.
  support supports_attention(precision) const override { return support::yes(); }

 private:
  std::unique_ptr<plan> make_plan(const config& cfg, formulation form,
                                  const weights& w) const override {
    return detail::make_isa_plan<tbb_kernel_set>(detail::dispatched_isa(), cfg, form, w, name());
  }
  void attend(const detail::attention_args& args, const run_options& options) const override {
    detail::run_in(options, [&] {
      detail::parallel_attention(detail::kernels_for(detail::dispatched_isa()), args);
    });
  }
  // An attention cache: a plan's, in the layout of the kernels of the ISA in use.
  std::int64_t attention_cache_head_bytes(std::int64_t capacity, std::int64_t head_dim,
                                          precision kv, precision compute) const noexcept override {
    return detail::cache_head_bytes(detail::kernels_for(detail::dispatched_isa()), capacity,
                                    head_dim, compute == precision::bf16, kv);
  }
};

}  // namespace

const backend& tbb_backend() {
  static const tbb_impl instance;
  return instance;
}

}  // namespace mha
