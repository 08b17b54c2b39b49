#include "task_traces.hpp"

#include <algorithm>
#include <chrono>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <ostream>
#include <vector>

#include "backends/tbb/task_trace.hpp"
#include "check.hpp"
#include "machine/machine_context.hpp"
#include "machine/stream_read.hpp"
#include "mha/error.hpp"
#include "mha_testing.hpp"

namespace mha_bench {
namespace {

using json = nlohmann::json;

struct traced_run {
  std::int64_t run_ns = 0;
  std::vector<mha::detail::traced_phase> phases;
};

// One run of the case's plan under a trace; a decode step first rewinds the cache to `past`
// zero tokens, outside the trace.
traced_run trace_once(const mha::plan& plan, const mha::problem& p, const shape_fixture& fixture,
                      std::span<float> y, mha::kv_cache* cache, int threads) {
  const mha::tensor_view<const float> x(fixture.x().data(), p.batch, p.seq_len, p.cfg.d_in);
  const mha::tensor_view<float> out(y.data(), p.batch, p.seq_len, p.cfg.d_out);
  if (cache) mha_testing::hold_zero_tokens(*cache, p.past);
  mha::detail::task_trace trace;
  const auto start = std::chrono::steady_clock::now();
  if (cache) {
    plan.run(x, out, *cache, {.threads = threads});
  } else {
    plan.run(x, out, {.threads = threads});
  }
  const auto end = std::chrono::steady_clock::now();
  return {std::chrono::duration_cast<std::chrono::nanoseconds>(end - start).count(),
          trace.finish()};
}

json trace_case(const bench_case& c, const mha::backend& tbb, const shape_fixture& fixture,
                int runs) {
  const mha::problem& p = c.problem;
  const auto plan = tbb.prepare(p.cfg, p.form, fixture.weights());
  std::vector<float> y(static_cast<std::size_t>(p.batch * p.seq_len * p.cfg.d_out));
  std::optional<mha::kv_cache> cache;
  if (p.past > 0) cache.emplace(plan->make_cache(p.batch, p.past + p.seq_len, p.kv_precision));
  mha::kv_cache* kv = cache ? &*cache : nullptr;
  trace_once(*plan, p, fixture, y, kv, c.threads);  // untimed: first-touch and workspaces
  std::vector<traced_run> traced;
  for (int r = 0; r < runs; ++r) traced.push_back(trace_once(*plan, p, fixture, y, kv, c.threads));
  std::sort(traced.begin(), traced.end(),
            [](const traced_run& a, const traced_run& b) { return a.run_ns < b.run_ns; });
  const traced_run& median = traced[traced.size() / 2];
  json phases = json::array();
  for (const mha::detail::traced_phase& ph : median.phases) {
    phases.push_back({{"kind", std::string(mha::detail::to_string(ph.kind))},
                      {"bytes", ph.bytes},
                      {"span_ns", ph.span_ns},
                      {"tasks_ns", ph.task_ns}});
  }
  return {{"name", c.name()},
          {"problem", mha::to_string(p)},
          {"threads", c.threads},
          {"run_ns", median.run_ns},
          {"phases", std::move(phases)}};
}

}  // namespace

void write_task_traces(const std::string& path, std::span<const bench_case> cases,
                       std::span<const mha::backend* const> backends, int hardware_threads,
                       int runs, const std::string& command, std::ostream* log) {
  if (runs < 1) {
    throw mha::invalid_argument("mha_bench: --trace-runs (" + std::to_string(runs) +
                                ") must be >= 1");
  }
  std::vector<const bench_case*> traced;
  for (const bench_case& c : cases) {
    if (backends[c.backend]->name() == "tbb") traced.push_back(&c);
  }
  if (traced.empty()) {
    throw mha::invalid_argument(
        "mha_bench: --trace records the tbb backend's tasks, and no selected case runs on tbb "
        "(is it built, and in --backends?)");
  }
  json context = {{"mha_cpu_model", cpu_model()},
                  {"mha_hardware_threads", hardware_threads},
                  {"mha_tbb_isa", std::string(mha::to_string(backends[traced[0]->backend]->isa()))},
                  {"mha_runs", runs},
                  {"mha_command", command}};
  json bandwidth = json::object();
  for (const int n : doubling_to_all(hardware_threads)) {
    if (log) *log << "mha_bench: streaming read on " << n << " thread(s)..." << std::endl;
    bandwidth[std::to_string(n)] = measure_stream_read(n, 2).gbps_all_cores;
  }
  context["mha_bandwidth_gbps"] = std::move(bandwidth);

  json traces = json::array();
  std::unique_ptr<shape_fixture> fixture;  // the current shape's, as the sweep keeps one
  for (const bench_case* c : traced) {
    if (log) *log << "mha_bench: tracing " << c->name() << std::endl;
    if (!fixture || !same_shape(fixture->problem(), c->problem)) {
      fixture.reset();
      fixture = std::make_unique<shape_fixture>(c->problem);
    }
    traces.push_back(trace_case(*c, *backends[c->backend], *fixture, runs));
  }
  std::ofstream file(path);
  file << json{{"context", std::move(context)}, {"traces", std::move(traces)}}.dump() << '\n';
  if (!file.flush()) throw mha::error("mha_bench: cannot write --trace file '" + path + "'");
}

}  // namespace mha_bench
