// mha_bench: "[n/M] name  ETA 1m23s" on stderr as each benchmark starts.
#pragma once

#include <chrono>
#include <cstddef>
#include <optional>
#include <ostream>
#include <string>
#include <string_view>
#include <vector>

namespace mha_bench {

// Expected wall seconds of one benchmark whose forward pass takes `run_seconds`: the check run,
// then per repetition Google Benchmark's timing, which grows the iteration count until one
// batch lasts min_time (about 1.6 x min_time in all when a run is shorter than min_time, one
// run otherwise).
double expected_wall_seconds(double run_seconds, double min_time, int repetitions);

// "0.4s", "42s", "3m05s", "2h07m".
std::string format_duration(double seconds);

// Progress of a sweep. Benchmarks are numbered by their index in the run order.
class progress {
 public:
  // expected[i]: expected_wall_seconds of benchmark i. out == nullptr prints nothing (--quiet).
  progress(std::vector<std::string> names, std::vector<double> expected, std::ostream* out);

  // Called on every entry into benchmark `index` (Google Benchmark calls a benchmark several
  // times); prints the line once, with `note` (e.g. why it is skipped) when not empty.
  void start(std::size_t index, std::string_view note = {});

  // Seconds left when benchmark `index` starts after `elapsed` seconds: the expected time of
  // benchmarks index.. scaled by how far the finished ones ran over or under expectation.
  double eta_seconds(std::size_t index, double elapsed) const;

 private:
  std::vector<std::string> names_;
  std::vector<double> expected_;
  std::ostream* out_;
  std::optional<std::chrono::steady_clock::time_point> started_;
  std::vector<bool> announced_;
};

}  // namespace mha_bench
