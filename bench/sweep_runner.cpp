#include "sweep_runner.hpp"

#include <algorithm>
#include <cstdio>
#include <exception>

#include "cache_bytes.hpp"
#include "mha_testing.hpp"
#include "reference.hpp"

namespace mha_bench {

double decode_bytes(const mha::problem& p) {
  const mha::config& c = p.cfg;
  const std::int64_t cache_heads = c.kv_heads();  // every formulation (mha::plan::cache_heads)
  const double weights = static_cast<double>(c.d_in) * (c.d_out + 2 * cache_heads * c.head_dim()) +
                         (c.out_proj ? static_cast<double>(c.d_out) * c.d_out : 0.0);
  const auto element_bytes = [](mha::precision q) { return q == mha::precision::fp32 ? 4.0 : 2.0; };
  const mha::precision cache = p.cache_precision();
  const double tokens = static_cast<double>(p.batch) * (p.past + p.seq_len) * cache_heads;
  return weights * element_bytes(c.precision) + tokens * cache_token_bytes(cache, c.head_dim());
}

void sweep_runner::run(benchmark::State& state, std::size_t index) {
  const bench_case& c = cases_[index];
  progress_.start(index, skip_[index].value_or(""));
  state.SetLabel(c.label());
  if (skip_[index]) {
    state.SkipWithError(skip_[index]->c_str());
    return;
  }
  prepared& p = prepare(index);
  if (!p.error.empty()) {
    state.SkipWithError(p.error.c_str());
    return;
  }
  const mha::problem& pr = c.problem;
  const mha::tensor_view<const float> x(fixture_->x().data(), pr.batch, pr.seq_len, pr.cfg.d_in);
  const mha::tensor_view<float> y(p.y.data(), pr.batch, pr.seq_len, pr.cfg.d_out);
  const mha::run_options options{.threads = c.threads};
  if (p.cache) {
    // A decode step: the cache rewinds to `past` zero tokens before each (bench/README.md).
    for (auto _ : state) {
      mha_testing::hold_zero_tokens(*p.cache, pr.past);
      p.plan->run(x, y, *p.cache, options);
      benchmark::ClobberMemory();
    }
  } else {
    for (auto _ : state) {
      p.plan->run(x, y, options);
      benchmark::ClobberMemory();
    }
  }
  auto& k = state.counters;
  using counter = benchmark::Counter;
  k["GFLOPS"] = counter(mha::flops(pr) * 1e-9, counter::kIsIterationInvariantRate);
  k["tokens_per_s"] =
      counter(static_cast<double>(pr.batch * pr.seq_len), counter::kIsIterationInvariantRate);
  k["B"] = static_cast<double>(pr.batch);
  k["T"] = static_cast<double>(pr.seq_len);
  k["d_in"] = static_cast<double>(pr.cfg.d_in);
  k["d_out"] = static_cast<double>(pr.cfg.d_out);
  k["H"] = static_cast<double>(pr.cfg.n_heads);
  k["head_dim"] = static_cast<double>(pr.cfg.head_dim());
  // Not "threads": Google Benchmark writes its own "threads" (always 1 here) in each entry.
  k["n_threads"] = c.threads;
  k["past"] = static_cast<double>(pr.past);
  if (p.cache) {
    // The least a step reads: the weights and the cached keys and values, once each.
    const double bytes = decode_bytes(pr);
    k["bytes_min"] = bytes;
    k["GBps_min"] = counter(bytes * 1e-9, counter::kIsIterationInvariantRate);
  }
  k["check_rows"] = static_cast<double>(p.check.rows);
  k["check_max_err"] = p.check.max_error;
  k["check_rel_err"] = p.check.relative_error();
}

sweep_runner::prepared& sweep_runner::prepare(std::size_t index) {
  if (current_ && current_->index == index) return *current_;
  const bench_case& c = cases_[index];
  current_.reset();  // free the previous plan before building the next one
  current_.emplace();
  current_->index = index;
  prepared& p = *current_;
  try {
    if (!fixture_ || !same_shape(fixture_->problem(), c.problem)) {
      fixture_.reset();
      fixture_.emplace(c.problem);
    }
    const mha::problem& pr = c.problem;
    p.plan = backends_[c.backend]->prepare(pr.cfg, pr.form, fixture_->weights());
    p.y.assign(static_cast<std::size_t>(pr.batch * pr.seq_len * pr.cfg.d_out), 0.0f);
    const mha::tensor_view<const float> x(fixture_->x().data(), pr.batch, pr.seq_len, pr.cfg.d_in);
    const mha::tensor_view<float> y(p.y.data(), pr.batch, pr.seq_len, pr.cfg.d_out);
    if (pr.past > 0) {
      p.cache.emplace(p.plan->make_cache(pr.batch, pr.past + pr.seq_len, pr.kv_precision));
      mha_testing::hold_zero_tokens(*p.cache, pr.past);
      p.plan->run(x, y, *p.cache, {.threads = c.threads});
    } else {
      p.plan->run(x, y, {.threads = c.threads});
    }
    p.check = fixture_->check(p.y);
    const double tolerance = tolerance_for(pr);
    if (!p.check.passed(tolerance)) {
      char buffer[160];
      std::snprintf(buffer, sizeof buffer,
                    "wrong result: max |y - reference| = %.3g > %.3g * max|reference| "
                    "(%.3g) over %zu rows",
                    p.check.max_error, tolerance, p.check.max_reference, p.check.rows);
      p.error = buffer;
    }
  } catch (const std::exception& e) {
    p.error = std::string("error: ") + e.what();
  }
  if (!p.error.empty()) {
    ++failures_;
    p.plan.reset();
  }
  return p;
}

double sweep_runner::tolerance_for(const mha::problem& p) const noexcept {
  const double plan = p.cfg.precision == mha::precision::bf16
                          ? std::max(tolerance_, mha_reference::bf16_bound)
                          : tolerance_;
  return plan + fixture_->int8_cache_tolerance();
}

}  // namespace mha_bench
