// mha_bench: its own command-line flags (Google Benchmark's --benchmark_* flags are parsed by
// benchmark::Initialize before these).
#pragma once

#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "check.hpp"
#include "mha/config.hpp"
#include "sweep.hpp"

namespace mha_bench {

struct options {
  std::string preset = "quick";
  overrides lists;  // --batch --seq --heads --d-model --threads --kv-heads --past --precision ...
  std::vector<std::string> backends;  // --backends; empty: every backend built
  std::vector<mha::formulation> formulations = {
      mha::formulation::wrapper, mha::formulation::split_weight, mha::formulation::fused_qkv};
  // --budget: skip cases whose forward pass is estimated slower than this (0 = never). 5 s lets
  // the naive backend (~2.6 GFLOP/s here) run GPT-2 small and the heads preset's fixed-d_model
  // series (2-2.5 s per pass) and skips its passes of 6 s and more.
  double budget_seconds = 5.0;
  double tolerance = default_tolerance;  // --tolerance, relative to max|y| of the sample
  bool quiet = false;                    // --quiet: no progress on stderr
  bool list_shapes = false;              // --list-shapes: print the expanded shapes and exit
  std::string dump_shapes;               // --dump-shapes FILE: write the selected shapes, exit
  std::string dump_inputs;               // --dump-inputs DIR: write each shape's inputs, exit
  std::string trace;                     // --trace FILE: write the tbb cases' task traces, exit
  int trace_runs = 5;                    // --trace-runs: traced runs per case, the median kept
  mha_bench::shard shard;                // --shard I/N: run part I of N of the selection (1/1: all)
};

// Parses the arguments left once benchmark::Initialize has taken its flags (program name
// excluded). Flags take "--flag value" or "--flag=value"; lists are comma-separated. Throws
// mha::invalid_argument naming the flag and the bad value, or an unknown flag.
options parse_command_line(std::span<const std::string> args);

// The --help text.
std::string usage(std::string_view program);

// The value of Google Benchmark flag `--name=value` in the raw arguments (before Initialize
// consumes them), or `fallback` when absent or not a number. Used to estimate the sweep's time.
double benchmark_flag(std::span<const std::string> args, std::string_view name, double fallback);

}  // namespace mha_bench
