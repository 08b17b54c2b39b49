// mha_bench: what a sweep measures. Presets expand into series of shapes (each an mha::problem
// whose formulation the cases choose), shapes into benchmark cases (backend x formulation x
// shape x thread count), and slow cases are skipped when their estimated time exceeds the
// budget. Pure functions over plain data: no timing, no Google Benchmark, so all of it is
// unit-tested (tests/bench/). Defined by job: presets.cpp (the presets), sweep.cpp (the series
// algebra, the expansion, the shapes as JSON, the filter), shards.cpp (sharding, the budget).
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "mha/config.hpp"
#include "mha/problem.hpp"

namespace mha_bench {

// One shape of a sweep as a problem: input (batch, seq_len, d_model) after `past` cached tokens
// (0: a full forward pass) through a module with d_in = d_out = d_model, `heads` heads and
// kv_heads K/V heads (0: heads), in `precision`, its KV cache in `kv_precision` (nullopt or
// `precision`: the plan's own), every other field at its default (causal, out_proj with its
// bias, no qkv bias, no rotary embedding), context_length = past + seq_len, and a sliding
// window of `window` keys (0: plain causal attention; docs/design.md §1.9).
// Its formulation is split_weight: a shape stands for every formulation, and make_cases sets
// each case's.
mha::problem sweep_problem(std::int64_t batch, std::int64_t seq_len, std::int64_t d_model,
                           std::int64_t heads, std::int64_t kv_heads = 0, std::int64_t past = 0,
                           mha::precision precision = mha::precision::fp32,
                           std::optional<mha::precision> kv_precision = std::nullopt,
                           std::int64_t window = 0);

// Whether a and b are the same shape: equal but perhaps for their formulations.
bool same_shape(const mha::problem& a, const mha::problem& b) noexcept;

// The canonical problem string after its formulation, "b1/t128/din768/dout768/h12": the name
// of a shape in every formulation (mhapy.problem.Shape.problem_suffix spells it the same).
std::string shape_name(const mha::problem& p);

// A family of shapes a report draws as one line: every combination of its lists. Either
// d_model lists fixed model widths, or head_dim > 0 derives d_model = head_dim * H for each H
// (the fixed-head_dim series of the heads preset).
// The wave's axes (kv_heads or kv_groups, past, precisions, kv_precisions, window) are empty
// (their default only) but in the decode series (past: the cached lengths; the cache's
// precisions), the grouped-query series of the heads and decode presets and the window preset.
struct series {
  std::string name;  // "heads_d_model", "heads_head_dim", "seq", "threads", "quick_heads", ...
  std::vector<std::int64_t> batch, seq_len, heads, d_model;
  std::int64_t head_dim = 0;
  std::vector<int> threads;                            // run_options::threads values; each >= 1
  std::vector<std::int64_t> kv_heads = {}, past = {};  // empty: {0} (no grouping; no cache)
  // Query heads per K/V head, for series whose H varies: each H runs with H / g K/V heads (1:
  // multi-head, 0: one K/V head for all, multi-query); an H that g does not divide is dropped
  // with a notice. Non-empty replaces kv_heads.
  std::vector<std::int64_t> kv_groups = {};
  std::vector<mha::precision> precisions = {};  // empty: {fp32}
  // The KV cache's precisions (docs/design.md §1.7), each with every precision of the series;
  // empty: each plan's own. A float cache in another float precision than its plan's (fp32
  // with bf16) is no combination mha keeps, and a forward pass (past 0) keeps no cache: both
  // are dropped with a notice.
  std::vector<mha::precision> kv_precisions = {};
  // Sliding windows (docs/design.md §1.9), 0 for plain causal attention; empty: {0}. A window
  // that covers every key of a shape (w >= past + T) is that shape's causal attention: dropped
  // with a notice.
  std::vector<std::int64_t> window = {};
};

// The parts separated by `separator`: join({"a", "b"}, ",") == "a,b".
std::string join(std::span<const std::string> parts, std::string_view separator);

// "heads_head_dim: B=1 T=128 d_model=64*H H=1,2,...,96 threads=1,2".
std::string to_string(const series& s);

// "quick", "heads", "seq", "threads", "decode", "window", "cores", "full": the names preset()
// accepts.
std::span<const std::string_view> preset_names() noexcept;

// The series of a preset (bench/README.md lists them). `hardware_threads` (>= 1) sets
// the thread counts: {1, hardware_threads} everywhere, 1..hardware_threads in "threads", and
// 1, 2, 4, ... then hardware_threads in "cores".
// "full" is every series of the other presets. Throws mha::invalid_argument for an unknown
// name, listing the valid ones.
std::vector<series> preset(std::string_view name, int hardware_threads);

// Command-line replacements for a preset's lists. A set field replaces that list in every
// series; d_model replaces fixed widths only (a fixed-head_dim series keeps d_model = 64 * H).
struct overrides {
  std::optional<std::vector<std::int64_t>> batch, seq_len, heads, d_model, kv_heads, past, window;
  std::optional<std::vector<int>> threads;
  std::optional<std::vector<mha::precision>> precisions, kv_precisions;
};

// The series with `o` applied.
std::vector<series> apply(std::vector<series> list, const overrides& o);

// One shape at one thread count, with the name of every series that contains it.
struct sweep_point {
  mha::problem problem;  // a sweep_problem: its formulation is not the point's
  int threads = 1;
  std::vector<std::string> series;
};

struct expansion {
  // Each (shape, threads) once, shapes in first-seen order and each shape's thread counts
  // together, so a sweep builds a shape's weights and reference once.
  std::vector<sweep_point> points;
  // Shapes left out because d_model is not divisible by heads or heads by kv_heads, one line
  // each, e.g. "d_model 1000 is not divisible by 3 heads (B=1 T=128, series heads_d_model)".
  std::vector<std::string> dropped;
};

// Every combination of every series' lists. Throws mha::invalid_argument when a value is out
// of range (sizes and thread counts must be >= 1, kv_heads and past >= 0) or when no shape is
// left.
expansion expand(std::span<const series> list);

// The shapes of an expansion as the JSON list `python3 -m mhapy.peers --shapes` reads, one
// object per shape with every thread count and series name it appears with:
// [{"batch": 1, "seq_len": 128, "d_in": 768, "d_out": 768, "n_heads": 12, "causal": true,
//   "qkv_bias": false, "out_proj": true, "threads": [1, 2], "series": "quick_heads",
//   "name": "b1/t128/din768/dout768/h12", "flops": 2.6e9}, ...]
// with "n_kv_heads", "past", "precision", "kv_precision" and "window" too when not the default;
// "name" is the canonical problem string without its formulation, "flops" the model FLOPs of one
// call (mha::flops). The peers time exactly the shapes mha_bench does without keeping their own
// preset lists.
std::string shapes_json(const expansion& e);

// What make_cases needs to know about a backend.
struct backend_info {
  std::string name;
  int max_threads = 1;  // mha::backend::max_threads()
};

// One benchmark: a backend computing one problem (a shape in one formulation) at one thread
// count.
struct bench_case {
  std::size_t backend = 0;  // index into the backend list given to make_cases
  std::string backend_name;
  mha::problem problem;
  int threads = 1;
  std::vector<std::string> series;

  // "mha/naive/split_weight/b4/t256/din768/dout768/h12/threads:1" (Google Benchmark appends
  // "/real_time").
  std::string name() const;
  // "series=heads_head_dim,seq": the series the case belongs to (the JSON's "label").
  std::string label() const;
};

// The cases of a sweep in run order: shape-major, then backend (list order), formulation,
// thread count. A backend's thread counts are capped at its max_threads and merged, so a
// single-threaded backend runs threads:1 only, in the union of the merged points' series.
std::vector<bench_case> make_cases(std::span<const sweep_point> points,
                                   std::span<const backend_info> backends,
                                   std::span<const mha::formulation> formulations);

// The points of e that at least one case runs (same shape and thread count), for the peers'
// shape file: --backends and --benchmark_filter narrow what PyTorch times as they narrow mha_bench.
expansion covered_points(const expansion& e, std::span<const bench_case> cases);

// Whether Google Benchmark's --benchmark_filter `filter` selects `name`, as 1.7.1 decides it:
// a POSIX extended regex searched in the name; a leading '-' negates; "" and "all" select all.
// Throws mha::invalid_argument for a malformed regex.
bool filter_selects(std::string_view filter, std::string_view name);

// --shard I/N: part I (1-based) of N of a sweep's selected benchmarks (docs/design.md §3).
// Every shard of one selection is computed the same way on every task of a job array, from the
// selected cases alone, so the N parts are disjoint and together are the selection.
struct shard {
  int index = 1, count = 1;  // 1 <= index <= count
  bool operator==(const shard&) const = default;
};

// Reads "I/N" (1 <= I <= N); throws mha::invalid_argument naming the text otherwise.
shard parse_shard(std::string_view text);
// "2/4".
std::string to_string(shard s);

// The cost a partition balances: the expected wall time of the case (expected_wall_seconds,
// one repetition, min_time 0.5 s) with its forward pass timed at a nominal 10 GFLOP/s per
// thread, in integer microseconds. It depends on the model FLOPs (mha::flops) and the thread
// count only, never on this machine's speed, so every task of a fleet computes the same
// partition of the same selection.
std::int64_t shard_cost(const bench_case& c);

// 1, 2, 4, ... below hardware_threads, then hardware_threads itself: where scaling is read on a
// many-core machine without running every count.
std::vector<int> doubling_to_all(int hardware_threads);

// The shard (0-based, < count) of each case: the cases sorted by canonical name, then taken
// in decreasing cost (ties by name) and each given to the shard with the least cost so far
// (ties: the lowest shard). Deterministic, and independent of the cases' order. Throws
// mha::invalid_argument when count < 1.
std::vector<int> assign_shards(std::span<const bench_case> cases, int count);

// The cases of shard s (assign_shards), in their run order (the order of `cases`).
std::vector<bench_case> cases_of_shard(std::span<const bench_case> cases, shard s);

// A fingerprint of a selection: FNV-1a 64 of its canonical names (bench_case::name()), sorted,
// each followed by a newline, as 16 hex digits. The same selection gives the same fingerprint
// in any order, on any machine; a report uses it to tell which shards belong together.
std::string selection_fingerprint(std::span<const bench_case> cases);

// The points of e that shard s owns, for the peers' shape file of a sharded sweep: those its
// cases run and that no case of a lower-numbered shard runs, so the shards' PyTorch files are
// disjoint and together time covered_points(e, cases).
expansion shard_points(const expansion& e, std::span<const bench_case> cases, shard s);

// Estimated seconds of one forward pass of `c`, from the backend's single-thread rate on this
// formulation (GFLOP/s of model FLOPs) and perfect scaling over c.threads: an optimistic
// estimate, so the budget never skips a case that would fit.
double estimated_seconds(const bench_case& c, double gflops_one_thread);

// Why a case whose forward pass is estimated at `seconds` is skipped under `budget_seconds`
// (0 = no budget), or nullopt when it runs:
// "over budget: estimated 25.3 s per forward pass > --budget 5 s".
std::optional<std::string> budget_skip_reason(double seconds, double budget_seconds);

}  // namespace mha_bench
