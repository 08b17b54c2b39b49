// The oneDNN backend: the shared wrapper / split-weight / fused-QKV drivers (driver/driver.hpp)
// over the kernel set of oneDNN primitives (kernel_set.hpp; docs/design.md §2), what it
// declines, its description, and the introspection tests use (introspection.hpp).
#include <string>
#include <utility>
#include <vector>

#include "backends/onednn/introspection.hpp"
#include "backends/onednn/kernel_set.hpp"
#include "backends/onednn/runtime.hpp"
#include "base/text.hpp"
#include "driver/driver.hpp"
#include "mha/backends/onednn.hpp"
#include "mha/error.hpp"

namespace mha {
namespace {

using detail::onednn_kernel_set;
using detail::text;

static_assert(detail::kernel_set<onednn_kernel_set>);
using onednn_plan = detail::driver_plan<onednn_kernel_set>;

// The ISA oneDNN's kernels run on (dnnl::get_effective_cpu_isa()), in oneDNN's spelling.
std::string_view isa_name(dnnl::cpu_isa isa) {
  using enum dnnl::cpu_isa;
  static constexpr std::pair<dnnl::cpu_isa, std::string_view> names[] = {
      {sse41, "sse41"},
      {avx, "avx"},
      {avx2, "avx2"},
      {avx2_vnni, "avx2_vnni"},
      {avx512_mic, "avx512_mic"},
      {avx512_mic_4ops, "avx512_mic_4ops"},
      {avx512_core, "avx512_core"},
      {avx512_core_vnni, "avx512_core_vnni"},
      {avx512_core_bf16, "avx512_core_bf16"},
      {avx512_core_amx, "avx512_core_amx"}};
  for (const auto& [value, name] : names) {
    if (value == isa) return name;
  }
  return "unknown ISA";
}

// The class of oneDNN's effective ISA (its "avx" has no FMA: portable, as sse41).
mha::isa isa_class(dnnl::cpu_isa isa) {
  using enum dnnl::cpu_isa;
  switch (isa) {
    case avx2:
    case avx2_vnni:
      return mha::isa::avx2;
    case avx512_mic:
    case avx512_mic_4ops:
    case avx512_core:
    case avx512_core_vnni:
      return mha::isa::avx512;
    case avx512_core_bf16:
      return mha::isa::avx512bf16;
    case avx512_core_amx:
      return mha::isa::amx;
    default:
      return mha::isa::sse41;
  }
}

// Whether oneDNN's kernels multiply bf16 natively here (AVX512_BF16 or AMX). Below that,
// oneDNN 2.6 emulates bf16 on avx512_core with extra instructions per product, or (AVX2) has
// no bf16 matmul at all: slower than fp32, which is not what a bf16 plan is for.
bool native_bf16() { return mha::native_bf16(isa_class(dnnl::get_effective_cpu_isa())); }

// dnnl::version()->cpu_runtime as a word.
std::string_view runtime_name(unsigned runtime) {
  switch (runtime) {
    case DNNL_RUNTIME_OMP:
      return "OpenMP";
    case DNNL_RUNTIME_TBB:
      return "TBB";
    case DNNL_RUNTIME_SEQ:
      return "sequential";
    default:
      return "unknown";
  }
}

struct onednn_impl final : backend {
  std::string_view name() const noexcept override { return detail::onednn_name; }
  std::string description() const override {
    const dnnl::version_t* v = dnnl::version();
    return text("oneDNN ", v->major, ".", v->minor, ".", v->patch, " (",
                runtime_name(v->cpu_runtime), " runtime), ",
                isa_name(dnnl::get_effective_cpu_isa()),
                native_bf16() ? ", fp32 and bf16" : ", fp32");
  }
  mha::isa isa() const override { return isa_class(dnnl::get_effective_cpu_isa()); }
  int max_threads() const noexcept override { return detail::team_size(); }
  // What the kernel set computes: grouped K/V heads, decode and bf16, the last only where
  // oneDNN runs bf16 matmuls natively.
  support supports(const problem& p) const override {
    if (coded(p.cache_precision())) {
      // oneDNN 2.6's matmul multiplies int8 weights only with int8 sources, and takes one zero
      // point per tensor, not one per key: the codes would be widened to fp32 first, which is
      // the traffic a coded cache exists to save.
      return support::no(
          text("an ", to_string(p.cache_precision()),
               " KV cache is not implemented: oneDNN 2.6's matmul takes int8 weights only "
               "with int8 sources and one zero point per tensor, not a scale and offset per key"));
    }
    if (p.cfg.precision == precision::bf16 && !native_bf16()) {
      return support::no(
          text("bf16 needs oneDNN's avx512_core_bf16 kernels or newer, and its "
               "effective ISA here is ",
               isa_name(dnnl::get_effective_cpu_isa())));
    }
    return detail::driver_support<onednn_kernel_set>(p);
  }

 private:
  std::unique_ptr<plan> make_plan(const config& cfg, formulation form,
                                  const weights& w) const override {
    return std::make_unique<onednn_plan>(cfg, form, w, name());
  }
};

}  // namespace

const backend& onednn_backend() {
  static const onednn_impl instance;
  return instance;
}

bool onednn_thread_count_bitwise() {
  using enum dnnl::cpu_isa;
  switch (dnnl::get_effective_cpu_isa()) {
    case avx512_core:
    case avx512_core_vnni:
    case avx512_core_bf16:
    case avx512_core_amx:
      return true;
    default:
      return false;
  }
}

std::optional<std::string_view> onednn_isa_cap(isa which) {
  switch (which) {
    case isa::sse2:
    case isa::sse41:
      return "SSE41";
    case isa::avx2:
      return "AVX2";
    case isa::avx512:
      return "AVX512_CORE";
    case isa::avx512bf16:
      return "AVX512_CORE_BF16";
    case isa::amx:
      return "AVX512_CORE_AMX";
    case isa::scalar:
    case isa::neon64:
      break;
  }
  return std::nullopt;
}

namespace {

// p as the oneDNN plan it must be, with (batch, seq_len) in its range; `caller` names the
// introspection function in the errors.
const onednn_plan& introspected(std::string_view caller, const plan& p, std::int64_t batch,
                                std::int64_t seq_len) {
  const auto* own = dynamic_cast<const onednn_plan*>(&p);
  if (own == nullptr) {
    throw invalid_argument(
        text(caller, ": the plan is from backend '", p.backend_name(), "', expected onednn"));
  }
  if (batch < 1 || seq_len < 1 || seq_len > p.config().context_length) {
    throw invalid_argument(
        text(caller, ": shape (batch ", batch, ", seq_len ", seq_len,
             ") needs batch >= 1 and 1 <= seq_len <= ", p.config().context_length));
  }
  return *own;
}

}  // namespace

std::vector<std::string> detail::onednn_implementations(const plan& p, std::int64_t batch,
                                                        std::int64_t seq_len) {
  const onednn_plan& own = introspected("onednn_implementations", p, batch, seq_len);
  // A run on zeros builds (or finds) every primitive of the shape at the caller's team size.
  const std::vector<float> x(static_cast<std::size_t>(batch * seq_len * p.config().d_in));
  std::vector<float> y(static_cast<std::size_t>(batch * seq_len * p.config().d_out));
  p.run({x.data(), batch, seq_len, p.config().d_in}, {y.data(), batch, seq_len, p.config().d_out});
  return own.kernels().primitives().implementations(batch, seq_len);
}

std::vector<int> detail::onednn_cached_team_sizes(const plan& p, std::int64_t batch,
                                                  std::int64_t seq_len) {
  return introspected("onednn_cached_team_sizes", p, batch, seq_len)
      .kernels()
      .primitives()
      .team_sizes(batch, seq_len);
}

}  // namespace mha
