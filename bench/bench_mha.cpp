// mha_bench: every built backend x formulation x shape x thread count of a preset, registered
// at run time from mha::available_backends(), so a new backend is measured with no change
// here. Each benchmark prepares its plan, runs once and checks the output against the oracle,
// then times plan::run only (bench/README.md: flags, names, counters, context).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <thread>

#include "check.hpp"
#include "command_line.hpp"
#include "machine/fma_peak.hpp"
#include "machine/machine_context.hpp"
#include "mha/error.hpp"
#include "mha/registry.hpp"
#include "mha_testing.hpp"
#include "printed.hpp"
#include "progress.hpp"
#include "reference.hpp"
#include "sweep.hpp"
#include "sweep_runner.hpp"
#if MHA_BENCH_TRACE
#include "task_traces.hpp"
#endif

namespace {

using namespace mha_bench;

// The shape the backends' speeds are probed on (single-threaded, before the sweep) to
// estimate each case's time for the budget and the ETA: a GPT-2-wide module on a short input,
// 0.31 GFLOP, about 0.12 s on the naive backend and milliseconds on the others.
mha::problem probe_shape() { return sweep_problem(1, 64, 768, 12); }

using rate_key = std::pair<std::size_t, mha::formulation>;  // backend index, formulation

// Single-thread GFLOP/s of each backend x formulation the cases use, on probe_shape(): the
// faster of two runs (the first pays for one-time work such as JIT code generation), timed in
// process CPU time so that other load on the machine does not move the budget's decisions.
// 0 when the probe throws (the case then reports the error itself).
std::map<rate_key, double> probe_rates(std::span<const bench_case> cases,
                                       std::span<const mha::backend* const> backends) {
  std::map<rate_key, double> rates;
  const mha::problem shape = probe_shape();
  const mha::weights w = mha::weights::random(shape.cfg, 1);
  const std::vector<float> x(static_cast<std::size_t>(shape.batch * shape.seq_len * shape.cfg.d_in),
                             0.5f);
  std::vector<float> y(static_cast<std::size_t>(shape.batch * shape.seq_len * shape.cfg.d_out));
  for (const bench_case& c : cases) {
    const rate_key key{c.backend, c.problem.form};
    if (rates.contains(key)) continue;
    mha::problem p = shape;
    p.form = c.problem.form;
    double best = 0;
    try {
      const auto plan = backends[c.backend]->prepare(p.cfg, p.form, w);
      for (int run = 0; run < 2; ++run) {
        const std::clock_t start = std::clock();
        plan->run({x.data(), p.batch, p.seq_len, p.cfg.d_in},
                  {y.data(), p.batch, p.seq_len, p.cfg.d_out}, {.threads = 1});
        const double seconds = static_cast<double>(std::clock() - start) / CLOCKS_PER_SEC;
        best = std::max(best, mha::flops(p) * 1e-9 / std::max(seconds, 1e-6));
      }
    } catch (const std::exception&) {
      best = 0;
    }
    rates[key] = best;
  }
  return rates;
}

// One peak/<isa>/... entry: 4 short one-thread trials of the FMA loop; GFLOPS is the best,
// GFLOPS_min the worst (a plain value, not a rate: the entry's time is the trials').
void measure_peak_entry(benchmark::State& state, const std::string& isa) {
  std::vector<double> trials;
  for (auto _ : state) trials = fma_trials_one_core(isa, 4);
  if (trials.empty()) {
    state.SkipWithError(("no FMA loop named " + isa).c_str());
    return;
  }
  state.counters["GFLOPS"] = *std::max_element(trials.begin(), trials.end());
  state.counters["GFLOPS_min"] = *std::min_element(trials.begin(), trials.end());
}

// ---- The steps of a sweep, in the order run_sweep takes them ----

// The command line: mha_bench's options, and every argument as given (Google Benchmark's flags
// too: the estimate reads some, the context records them all).
struct command_line {
  options opt;
  std::vector<std::string> raw;
};

// Reads the command line: Google Benchmark takes its flags out of argv first, mha_bench's
// own are parsed from what is left. nullopt after --help or -h, which print the usage.
std::optional<command_line> read_command_line(int argc, char** argv) {
  std::vector<std::string> raw(argv + 1, argv + argc);
  for (const std::string& a : raw) {
    // Before benchmark::Initialize, which would print its own help and exit.
    if (a == "--help" || a == "-h") {
      std::cout << usage("mha_bench");
      return std::nullopt;
    }
  }
  benchmark::Initialize(&argc, argv);
  options opt = parse_command_line(std::vector<std::string>(argv + 1, argv + argc));
  return command_line{std::move(opt), std::move(raw)};
}

// What a sweep measures: the preset's series with the command line's lists, and their shapes.
struct sweep_shapes {
  std::vector<series> plan;
  expansion shapes;
};

// Expands the preset; says on stderr which shapes were dropped and why.
sweep_shapes expand_preset(const options& opt, int hardware_threads) {
  sweep_shapes sweep;
  sweep.plan = apply(preset(opt.preset, hardware_threads), opt.lists);
  sweep.shapes = expand(sweep.plan);
  for (const std::string& d : sweep.shapes.dropped) std::cerr << "mha_bench: dropped " << d << '\n';
  return sweep;
}

// --list-shapes: one line per point on stdout, "B=1 T=128 d_in=768 d_out=768 H=12 head_dim=64
// threads=1 series=quick_heads", with kv_heads, past, precision and kv_precision when not the
// default.
void print_shapes(const expansion& shapes) {
  for (const sweep_point& p : shapes.points) {
    const mha::config& c = p.problem.cfg;
    std::cout << "B=" << p.problem.batch << " T=" << p.problem.seq_len << " d_in=" << c.d_in
              << " d_out=" << c.d_out << " H=" << c.n_heads << " head_dim=" << c.head_dim();
    if (c.n_kv_heads > 0) std::cout << " kv_heads=" << c.n_kv_heads;
    if (p.problem.past > 0) std::cout << " past=" << p.problem.past;
    if (c.precision != mha::precision::fp32)
      std::cout << " precision=" << mha::to_string(c.precision);
    if (p.problem.kv_precision)
      std::cout << " kv_precision=" << mha::to_string(*p.problem.kv_precision);
    if (c.window > 0) std::cout << " window=" << c.window;
    std::cout << " threads=" << p.threads << " series=" << join(p.series, ",") << '\n';
  }
}

// The benchmarks a sweep selects: the backends it measures, the cases --benchmark_filter selects
// whose backend computes their problem (in run order), and the declined ones ("name: reason"),
// which the result file's context names (mha_declined) so a report can say what was not
// measured.
struct selection {
  std::vector<const mha::backend*> backends;
  std::vector<bench_case> cases;
  std::vector<std::string> declined;
};

// Selects the cases of `shapes` (logging the declined ones), so that counts, probes and
// the ETA cover what will run. Throws mha::invalid_argument when none is left.
selection select_cases(const options& opt, const expansion& shapes, std::ostream* log) {
  selection s;
  if (opt.backends.empty()) {
    s.backends = mha::available_backends();
  } else {
    for (const std::string& name : opt.backends) s.backends.push_back(&mha::require_backend(name));
  }
  std::vector<backend_info> infos;
  for (const mha::backend* b : s.backends)
    infos.push_back({std::string(b->name()), b->max_threads()});

  const std::string filter = benchmark::GetBenchmarkFilter();
  for (bench_case& c : make_cases(shapes.points, infos, opt.formulations)) {
    if (!filter_selects(filter, c.name() + "/real_time")) continue;
    if (const mha::support verdict = s.backends[c.backend]->supports(c.problem); !verdict) {
      s.declined.push_back(c.name() + ": " + verdict.reason());
      continue;
    }
    s.cases.push_back(std::move(c));
  }
  if (log) {
    for (const std::string& d : s.declined) *log << "mha_bench: declined " << d << '\n';
  }
  if (s.cases.empty() && !s.declined.empty()) {
    throw mha::invalid_argument("mha_bench: every selected benchmark is declined by its backend");
  }
  if (s.cases.empty()) {
    throw mha::invalid_argument("mha_bench: no benchmark of preset " + opt.preset +
                                " matches --benchmark_filter=" + filter);
  }
  return s;
}

// --dump-shapes: writes the shapes shard s's cases run (shard_points) as the JSON
// `python3 -m mhapy.peers --shapes` reads. Throws mha::error when it cannot write.
void dump_shapes(const std::string& path, const expansion& shapes,
                 std::span<const bench_case> cases, shard s) {
  std::ofstream file(path);
  file << shapes_json(shard_points(shapes, cases, s));
  if (!file.flush()) {
    throw mha::error("mha_bench: cannot write --dump-shapes file '" + path + "'");
  }
}

// --dump-inputs: writes the fixture of each shape shard s's cases run (a shape's
// thread counts share its inputs) to dir/<shape_name with '_' for '/'>.safetensors.
void dump_inputs(const std::string& dir, const expansion& shapes, std::span<const bench_case> cases,
                 shard s) {
  std::filesystem::create_directories(dir);
  std::set<std::string> written;
  for (const sweep_point& p : shard_points(shapes, cases, s).points) {
    std::string name = shape_name(p.problem);
    std::replace(name.begin(), name.end(), '/', '_');
    if (!written.insert(name).second) continue;
    write_fixture(shape_fixture(p.problem), std::filesystem::path(dir) / (name + ".safetensors"));
  }
}

// This run's part of a selection (--shard) and what names the whole selection: every shard
// records the selection's fingerprint and size, so a report can tell which shards of which
// selection it has.
struct shard_part {
  std::vector<bench_case> cases;  // this shard's, in run order
  std::string selection;          // selection_fingerprint of the whole selection
  std::size_t selection_size = 0;
};

// Takes shard s of the selected cases; with more than one shard, says on stderr which.
shard_part take_shard(std::span<const bench_case> selected, shard s) {
  shard_part part{.cases = cases_of_shard(selected, s),
                  .selection = selection_fingerprint(selected),
                  .selection_size = selected.size()};
  if (s.count > 1) {
    std::cerr << "mha_bench: shard " << to_string(s) << ": " << part.cases.size() << " of the "
              << part.selection_size << " selected benchmarks (selection " << part.selection
              << ")\n";
    if (part.cases.empty()) {
      std::cerr << "mha_bench: this shard is empty (more shards than benchmarks); its result "
                   "file holds the peak entries and says which shard it is\n";
    }
  }
  return part;
}

// The yardsticks of the machine, measured before the sweep: the FP32 FMA peak of each ISA (and
// the bf16 dot-product peak) and the streaming-read bandwidth.
struct yardsticks {
  fma_peak peak;
  stream_read bandwidth;
};

// Measures the yardsticks on one core and on `hardware_threads`, logging them.
yardsticks measure_yardsticks(int hardware_threads, std::ostream* log) {
  if (log) *log << "mha_bench: measuring the FP32 FMA peak..." << std::endl;
  yardsticks y{.peak = measure_fma_peak(hardware_threads), .bandwidth = {}};
  if (log) {
    // "mha_bench: <what> 117.4 GFLOP/s on one core, 228.5 on 2 threads"
    const auto line = [&](const std::string& what, const isa_peak& p) {
      *log << "mha_bench: " << what << " " << printed("%.1f", p.gflops_one_core)
           << " GFLOP/s on one core, " << printed("%.1f", p.gflops_all_cores) << " on "
           << y.peak.threads << " threads" << std::endl;
    };
    for (const isa_peak& p : y.peak.by_isa) line("FMA peak (" + p.isa + ")", p);
    if (y.peak.bf16_dot) line("bf16 dot-product peak (vdpbf16ps)", *y.peak.bf16_dot);
    if (y.peak.bf16_tile) line("bf16 tile-product peak (AMX)", *y.peak.bf16_tile);
  }
  if (log) *log << "mha_bench: measuring the streaming-read bandwidth..." << std::endl;
  y.bandwidth = measure_stream_read(hardware_threads);
  if (log) {
    *log << "mha_bench: streaming read " << printed("%.1f", y.bandwidth.gbps_one_core)
         << " GB/s on one core, " << printed("%.1f", y.bandwidth.gbps_all_cores) << " on "
         << y.bandwidth.threads << " threads" << std::endl;
  }
  return y;
}

// What the budget and the ETA are decided from: each backend x formulation's probed rate and,
// per case in run order, why it is skipped (nullopt: it runs) and its expected wall seconds.
struct estimates {
  std::map<rate_key, double> rates;
  std::vector<std::optional<std::string>> skip;
  std::vector<double> expected;  // 0 for a skipped case
  int over_budget = 0;
};

// Probes the rates, skips the cases over --budget and estimates the sweep's time (the
// total logged), with the --benchmark_min_time and --benchmark_repetitions of `cmd`.
estimates estimate_cases(const command_line& cmd, std::span<const bench_case> cases,
                         std::span<const mha::backend* const> backends, std::ostream* log) {
  estimates e{.rates = probe_rates(cases, backends), .skip = {}, .expected = {}, .over_budget = 0};
  const double min_time = benchmark_flag(cmd.raw, "benchmark_min_time", 0.5);
  const int repetitions = static_cast<int>(benchmark_flag(cmd.raw, "benchmark_repetitions", 1));
  for (const bench_case& c : cases) {
    const double rate = e.rates.at({c.backend, c.problem.form});
    const double seconds = rate > 0 ? estimated_seconds(c, rate) : 0.0;
    e.skip.push_back(budget_skip_reason(seconds, cmd.opt.budget_seconds));
    e.expected.push_back(e.skip.back() ? 0.0
                                       : expected_wall_seconds(seconds, min_time, repetitions));
    e.over_budget += e.skip.back() ? 1 : 0;
  }
  if (log) {
    double total = 0;
    for (double x : e.expected) total += x;
    *log << "mha_bench: preset " << cmd.opt.preset << ", " << cases.size() << " benchmarks ("
         << e.over_budget << " over the " << printed("%g", cmd.opt.budget_seconds)
         << " s budget), about " << format_duration(total) << std::endl;
  }
  return e;
}

// Registers runner's cases in run order, with the peaks of the ISAs the backends use
// measured again at the start, middle and end of the run (entries peak/<isa>/threads:1/at:<k>),
// so a report can take the best and see the spread. runner must outlive the run.
void register_benchmarks(sweep_runner& runner, std::span<const mha::backend* const> backends) {
  std::set<std::string> peak_isas;
  for (const mha::backend* b : backends) peak_isas.emplace(mha::fma_peak_of(b->isa()));
  const auto register_peaks = [&](int at) {
    for (const std::string& isa : peak_isas) {
      benchmark::RegisterBenchmark(
          ("peak/" + isa + "/threads:1/at:" + std::to_string(at)).c_str(),
          [isa](benchmark::State& state) { measure_peak_entry(state, isa); })
          ->Iterations(1)
          ->Unit(benchmark::kMillisecond);
    }
  };
  const std::size_t middle = runner.cases().size() / 2;
  register_peaks(0);
  for (std::size_t i = 0; i < runner.cases().size(); ++i) {
    if (i == middle && middle > 0) register_peaks(1);
    benchmark::RegisterBenchmark(runner.cases()[i].name().c_str(),
                                 [&runner, i](benchmark::State& state) { runner.run(state, i); })
        ->UseRealTime()
        ->Unit(benchmark::kMillisecond);
  }
  register_peaks(2);
}

// Describes the run in the result file's context: the machine, the yardsticks, what
// each backend dispatched to, and the mha_* keys of the sweep (bench/README.md lists them).
void add_sweep_context(const command_line& cmd, const sweep_shapes& sweep, const selection& s,
                       const shard_part& part, const yardsticks& measured, const estimates& e) {
  const options& opt = cmd.opt;
  add_machine_context();
  add_peak_context(measured.peak);
  add_bandwidth_context(measured.bandwidth);
  add_dispatch_context(s.backends);
  benchmark::AddCustomContext("mha_preset", opt.preset);
  std::vector<std::string> series_text;
  for (const series& x : sweep.plan) series_text.push_back(to_string(x));
  benchmark::AddCustomContext("mha_series", join(series_text, "; "));
  benchmark::AddCustomContext("mha_dropped_shapes", join(sweep.shapes.dropped, "; "));
  benchmark::AddCustomContext("mha_declined", join(s.declined, "; "));
  std::vector<std::string> backend_names, formulation_names;
  for (const mha::backend* b : s.backends) {
    const std::string name(b->name());
    backend_names.push_back(name);
    benchmark::AddCustomContext("mha_backend_" + name + "_description", b->description());
    benchmark::AddCustomContext("mha_backend_" + name + "_max_threads",
                                std::to_string(b->max_threads()));
  }
  for (mha::formulation f : opt.formulations) formulation_names.emplace_back(mha::to_string(f));
  benchmark::AddCustomContext("mha_backends", join(backend_names, ","));
  benchmark::AddCustomContext("mha_formulations", join(formulation_names, ","));
  for (const auto& [key, rate] : e.rates) {
    benchmark::AddCustomContext("mha_probe_gflops_" + backend_names[key.first] + "_" +
                                    std::string(mha::to_string(key.second)),
                                printed("%.2f", rate));
  }
  benchmark::AddCustomContext("mha_budget_s", printed("%g", opt.budget_seconds));
  benchmark::AddCustomContext("mha_over_budget", std::to_string(e.over_budget));
  benchmark::AddCustomContext(
      "mha_check",
      "before timing, one run per benchmark against the double-precision oracle "
      "(mha_reference::forward_rows) on batch elements {0, B-1} x tokens {0, T/3, 2T/3, T-1}; "
      "passes when max|y - reference| <= mha_check_tolerance * max|reference| "
      "(mha_check_tolerance_bf16 for bf16: the oracle then rounds as the module does; with an "
      "int8, k8v4 or int4 KV cache plus that cache's derived bound, "
      "mha_reference::int8_cache_bound, "
      "over max|reference|)");
  benchmark::AddCustomContext("mha_check_tolerance", printed("%g", opt.tolerance));
  benchmark::AddCustomContext("mha_check_tolerance_bf16",
                              printed("%g", std::max(opt.tolerance, mha_reference::bf16_bound)));
  benchmark::AddCustomContext("mha_command", join(cmd.raw, " "));
  benchmark::AddCustomContext("mha_shard", to_string(opt.shard));
  benchmark::AddCustomContext("mha_selection", part.selection);
  benchmark::AddCustomContext("mha_selection_benchmarks", std::to_string(part.selection_size));
  benchmark::AddCustomContext("mha_shard_benchmarks", std::to_string(part.cases.size()));
}

// Runs the registered benchmarks; the exit status: 1 when a case failed its check or
// threw, else 0.
int run_benchmarks(const sweep_runner& runner) {
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  if (runner.failures() > 0) {
    std::cerr << "mha_bench: " << runner.failures()
              << " benchmark(s) failed their check or threw; see their error_message\n";
    return 1;
  }
  return 0;
}

// The sweep, step by step; the exit status (0, 1 for a failed case; errors throw).
int run_sweep(int argc, char** argv) {
  const std::optional<command_line> cmd = read_command_line(argc, argv);
  if (!cmd) return 0;
  const options& opt = cmd->opt;
  std::ostream* log = opt.quiet ? nullptr : &std::cerr;
  const int hardware_threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));

  const sweep_shapes sweep = expand_preset(opt, hardware_threads);
  if (opt.list_shapes) {
    print_shapes(sweep.shapes);
    return 0;
  }
  const selection selected = select_cases(opt, sweep.shapes, log);
  if (!opt.dump_shapes.empty()) {
    dump_shapes(opt.dump_shapes, sweep.shapes, selected.cases, opt.shard);
    return 0;
  }
  if (!opt.dump_inputs.empty()) {
    dump_inputs(opt.dump_inputs, sweep.shapes, selected.cases, opt.shard);
    return 0;
  }
  if (!opt.trace.empty()) {
#if MHA_BENCH_TRACE
    write_task_traces(opt.trace, cases_of_shard(selected.cases, opt.shard), selected.backends,
                      hardware_threads, opt.trace_runs, join(cmd->raw, " "), log);
    return 0;
#else
    throw mha::invalid_argument(
        "mha_bench: --trace records the tbb backend's tasks, and this "
        "build has no tbb backend");
#endif
  }
  const shard_part part = take_shard(selected.cases, opt.shard);

  const yardsticks measured = measure_yardsticks(hardware_threads, log);
  const estimates e = estimate_cases(*cmd, part.cases, selected.backends, log);
  std::vector<std::string> names;
  for (const bench_case& c : part.cases) names.push_back(c.name());
  sweep_runner runner(part.cases, selected.backends, e.skip, opt.tolerance,
                      progress(std::move(names), e.expected, log));
  register_benchmarks(runner, selected.backends);
  add_sweep_context(*cmd, sweep, selected, part, measured, e);
  return run_benchmarks(runner);
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run_sweep(argc, argv);
  } catch (const std::exception& e) {
    std::cerr << e.what() << '\n';
    return 2;
  }
}
