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
#include "reference/reference.hpp"

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

int verify(const arguments& a) {
  std::vector<const mha::backend*> backends = mha::available_backends();
  if (a.has("backend")) backends = {&mha::require_backend(a.required("backend"))};
  const double tolerance = a.real_or("tolerance", 1e-5);
  const int threads = static_cast<int>(a.integer_or("threads", 0, 0, mha::max_run_threads));
  if (!(tolerance >= 0.0)) throw usage_error("--tolerance must be >= 0");

  std::printf("%-8s %-58s %-12s %-15s %s\n", "backend", "problem", "mode", "max|err|/max|y|",
              "result");
  int failed = 0, total = 0, declined = 0;
  for (const mha::backend* b : backends) {
    for (const mha::formulation form :
         {mha::formulation::wrapper, mha::formulation::split_weight}) {
      for (verify_case c : verify_cases()) {
        c.p.form = form;
        const mha::config& cfg = c.p.cfg;
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
  std::printf("%d of %d passed (tolerance %.1e of max|y|)", total - failed, total, tolerance);
  if (declined > 0) std::printf("; %d declined by their backend (not failures)", declined);
  std::printf("\n");
  return failed == 0 ? 0 : 1;
}

}  // namespace

const command& verify_command() {
  static const command c{
      "verify",
      "check every backend x formulation against the double-precision reference",
      "usage: mha verify [--backend B] [--threads N] [--tolerance R]\n\n"
      "Runs every backend (or B) in both formulations on random modules of a few awkward\n"
      "shapes (one token, 96 heads, odd head_dim, no out_proj, non-causal, biases, training\n"
      "dropout, grouped K/V heads) and compares each output with the double-precision\n"
      "reference. Prints one row per run, or the reason a backend declines the problem;\n"
      "exits 1 when any error exceeds R * max|y| (default R = 1e-5). Declines are not failures.\n",
      {"backend", "threads", "tolerance"},
      {},
      verify};
  return c;
}

}  // namespace mha_cli
