// mha verify: every backend x formulation on random modules against the double-precision oracle.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "cli/arguments.hpp"
#include "mha/problem.hpp"
#include "mha/registry.hpp"
#include "reference.hpp"

namespace mha_cli {
namespace {

// A problem (the formulation is set per row) and how it is run.
struct verify_case {
  mha::problem p;
  bool training = false;
};

// Small and awkward shapes: one token, odd and tiny head_dims, 96 heads, no out_proj,
// non-causal, biases, training-mode dropout with the shared mask, one a few kernel tiles
// wide, and grouped K/V heads (3 query heads per K/V head). About 0.1 s per backend and
// formulation on naive.
std::vector<verify_case> verify_cases() {
  auto make = [](std::int64_t b, std::int64_t t, std::int64_t d_in, std::int64_t d_out,
                 std::int64_t h) {
    verify_case c;
    c.p.cfg = {.d_in = d_in, .d_out = d_out, .n_heads = h, .context_length = t};
    c.p.batch = b;
    c.p.seq_len = t;
    return c;
  };
  std::vector<verify_case> cases = {make(1, 1, 8, 8, 1),      make(2, 17, 24, 30, 3),
                                    make(3, 33, 31, 99, 3),   make(1, 64, 64, 192, 96),
                                    make(2, 128, 96, 96, 12), make(1, 200, 256, 256, 8),
                                    make(2, 33, 48, 48, 6)};
  cases[1].p.cfg.qkv_bias = true;
  cases[2].p.cfg.causal = false;
  cases[2].p.cfg.out_proj = false;
  cases[4].p.cfg.dropout = 0.1f;
  cases[4].training = true;
  cases[6].p.cfg.n_kv_heads = 2;
  return cases;
}

// max |y - expected| / max |expected|; NaN when y has a NaN.
double relative_error(const std::vector<float>& y, const std::vector<double>& expected) {
  double error = 0.0, scale = 0.0;
  for (std::size_t i = 0; i < y.size(); ++i) {
    const double d = std::abs(static_cast<double>(y[i]) - expected[i]);
    if (std::isnan(d)) return d;
    error = std::max(error, d);
    scale = std::max(scale, std::abs(expected[i]));
  }
  return scale > 0.0 ? error / scale : error;
}

// --precision: a comma-separated list of fp32 and bf16 (default both).
std::vector<mha::precision> precisions(const arguments& a) {
  std::vector<mha::precision> list;
  const std::string given = a.text_or("precision", "fp32,bf16");
  for (std::size_t at = 0; at <= given.size();) {
    const std::size_t end = std::min(given.find(',', at), given.size());
    list.push_back(mha::parse_precision(std::string_view(given).substr(at, end - at)));
    at = end + 1;
  }
  return list;
}

int verify(const arguments& a) {
  std::vector<const mha::backend*> backends = mha::available_backends();
  if (a.has("backend")) backends = {&mha::require_backend(a.required("backend"))};
  // The default tolerances: fp32 sums against double; bf16 the design's bound against the
  // oracle of the same rounding (docs/design.md §1.5).
  const double fp32_tolerance = a.real_or("tolerance", 1e-5),
               bf16_tolerance = a.real_or("tolerance", mha_reference::bf16_bound);
  const int threads = static_cast<int>(a.integer_or("threads", 0, 0, mha::max_run_threads));
  if (!(fp32_tolerance >= 0.0)) throw usage_error("--tolerance must be >= 0");
  const std::vector<mha::precision> checked = precisions(a);

  std::printf("%-8s %-58s %-12s %-15s %s\n", "backend", "problem", "mode", "max|err|/max|y|",
              "result");
  int failed = 0, total = 0, declined = 0;
  for (const mha::backend* b : backends) {
    for (const mha::formulation form : mha::formulations()) {
      for (const mha::precision precision : checked) {
        for (verify_case c : verify_cases()) {
          c.p.form = form;
          c.p.cfg.precision = precision;
          const mha::config& cfg = c.p.cfg;
          const double tolerance =
              precision == mha::precision::bf16 ? bf16_tolerance : fp32_tolerance;
          if (const mha::support s = b->supports(c.p); !s) {
            ++declined;
            std::printf("%-8s %-58s %-12s %-15s declined: %s\n", std::string(b->name()).c_str(),
                        mha::to_string(c.p).c_str(), "-", "-", s.reason().c_str());
            continue;
          }
          const mha::weights w = mha::weights::random(cfg, 7);
          std::mt19937 gen(11);
          std::uniform_real_distribution<float> dist(-3.0f, 3.0f);
          std::vector<float> x(static_cast<std::size_t>(c.p.batch * c.p.seq_len * cfg.d_in));
          for (float& v : x) v = dist(gen);
          const mha::run_options options{.threads = threads, .training = c.training, .seed = 5};

          std::vector<float> y(static_cast<std::size_t>(c.p.batch * c.p.seq_len * cfg.d_out));
          b->prepare(cfg, form, w)
              ->run({x.data(), c.p.batch, c.p.seq_len, cfg.d_in},
                    {y.data(), c.p.batch, c.p.seq_len, cfg.d_out}, options);
          const double error =
              relative_error(y, mha_reference::forward(cfg, w, x, c.p.batch, c.p.seq_len, options));
          const bool pass = error <= tolerance;
          failed += pass ? 0 : 1;
          ++total;
          const std::string mode =
              c.training ? "train p=" + std::to_string(cfg.dropout).substr(0, 4) : "inference";
          std::printf("%-8s %-58s %-12s %-15.2e %s\n", std::string(b->name()).c_str(),
                      mha::to_string(c.p).c_str(), mode.c_str(), error, pass ? "pass" : "FAIL");
        }
      }
    }
  }
  std::printf("%d of %d passed (tolerance of max|y|: %.1e fp32, %.1e bf16)", total - failed, total,
              fp32_tolerance, bf16_tolerance);
  if (declined > 0) std::printf("; %d declined by their backend (not failures)", declined);
  std::printf("\n");
  return failed == 0 ? 0 : 1;
}

}  // namespace

const command& verify_command() {
  static const command c{
      "verify",
      "check every backend x formulation against the double-precision reference",
      "usage: mha verify [--backend B] [--precision LIST] [--threads N] [--tolerance R]\n\n"
      "Runs every backend (or B) in every formulation and precision (or LIST: fp32, bf16)\n"
      "on random modules of a few awkward shapes (one token, 96 heads, odd head_dim, no\n"
      "out_proj, non-causal, biases, training dropout, grouped K/V heads) and compares each\n"
      "output with the double-precision reference of the same precision (bf16: operands\n"
      "rounded as the module rounds them). Prints one row per run, or the reason a backend\n"
      "declines the problem; exits 1 when any error exceeds R * max|y| (default R = 1e-5 for\n"
      "fp32 and 2^-8 for bf16, docs/design.md §1.5). Declines are not failures.\n",
      {"backend", "precision", "threads", "tolerance"},
      {},
      verify};
  return c;
}

}  // namespace mha_cli
