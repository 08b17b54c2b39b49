// The runner of mha_bench's sweep: one benchmark per case, its plan prepared and checked once,
// then plan::run timed, with the counters bench/README.md lists.
#pragma once

#include <benchmark/benchmark.h>

#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "check.hpp"
#include "mha/mha.hpp"
#include "progress.hpp"
#include "sweep.hpp"

namespace mha_bench {

// Bytes a decode step of p reads at least: every weight once (4 bytes each in an fp32 plan, 2 in
// a bf16 one) and the keys and values of every cached and new token once (kv_heads K/V heads in
// every formulation), each row of head_dim elements in the cache's precision: 4 or 2 bytes an
// element, or 1 byte an element and a 4-byte word of scale and zero a row (int8; k8v4's value
// rows half a byte an element and a word a group of 32, int4's key rows so too with a word per
// channel a group of 64 tokens: docs/design.md §1.7).
double decode_bytes(const mha::problem& p);

// Shared by every benchmark of the sweep. Google Benchmark calls one benchmark function several
// times in a row (growing the iteration count, then once per repetition), so the current
// shape's fixture and the current case's plan and check are built once and kept until another
// shape or case starts: at most one of each is alive, which bounds memory at d_model 6144.
class sweep_runner {
 public:
  sweep_runner(std::vector<bench_case> cases, std::vector<const mha::backend*> backends,
               std::vector<std::optional<std::string>> skip, double tolerance,
               mha_bench::progress progress)
      : cases_(std::move(cases)),
        backends_(std::move(backends)),
        skip_(std::move(skip)),
        tolerance_(tolerance),
        progress_(std::move(progress)) {}

  const std::vector<bench_case>& cases() const noexcept { return cases_; }
  // Cases that failed their check or threw: the process exits with 1 when there are any.
  int failures() const noexcept { return failures_; }

  // The benchmark of cases()[index]: skipped with its reason (over the budget, a failed check, an
  // error), else plan::run timed (a decode step after rewinding the cache to `past` tokens) and
  // the case's counters set.
  void run(benchmark::State& state, std::size_t index);

 private:
  struct prepared {
    std::size_t index = 0;
    std::unique_ptr<mha::plan> plan;
    std::vector<float> y;
    std::optional<mha::kv_cache> cache;  // decode cases (past > 0)
    check_result check;
    std::string error;  // why the case cannot be timed; empty when it can
  };

  prepared& prepare(std::size_t index);

  // The check's tolerance: --tolerance, for bf16 at least the bound every backend is held to
  // against the bf16 oracle, and with an int8 KV cache that cache's bound on top.
  double tolerance_for(const mha::problem& p) const noexcept;

  std::vector<bench_case> cases_;
  std::vector<const mha::backend*> backends_;
  std::vector<std::optional<std::string>> skip_;
  double tolerance_;
  mha_bench::progress progress_;
  std::optional<shape_fixture> fixture_;
  std::optional<prepared> current_;
  int failures_ = 0;
};

}  // namespace mha_bench
