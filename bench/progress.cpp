#include "progress.hpp"

#include <cmath>
#include <cstdio>
#include <numeric>

namespace mha_bench {

double expected_wall_seconds(double run_seconds, double min_time, int repetitions) {
  // Benchmark 1.7.1 starts with one iteration and multiplies the count by up to
  // 1.4 * min_time / elapsed until a batch lasts min_time.
  const double timing = run_seconds >= min_time ? run_seconds : 1.6 * min_time;
  return run_seconds + timing * std::max(1, repetitions);
}

std::string format_duration(double seconds) {
  char buffer[32];
  if (!(seconds >= 0)) seconds = 0;
  if (seconds < 10) {
    std::snprintf(buffer, sizeof buffer, "%.1fs", seconds);
    return buffer;
  }
  const long s = std::lround(seconds);
  if (s < 60) {
    std::snprintf(buffer, sizeof buffer, "%lds", s);
  } else if (s < 3600) {
    std::snprintf(buffer, sizeof buffer, "%ldm%02lds", s / 60, s % 60);
  } else {
    std::snprintf(buffer, sizeof buffer, "%ldh%02ldm", s / 3600, (s % 3600) / 60);
  }
  return buffer;
}

progress::progress(std::vector<std::string> names, std::vector<double> expected, std::ostream* out)
    : names_(std::move(names)),
      expected_(std::move(expected)),
      out_(out),
      announced_(names_.size(), false) {}

double progress::eta_seconds(std::size_t index, double elapsed) const {
  const auto begin = expected_.begin();
  const auto at = begin + static_cast<std::ptrdiff_t>(std::min(index, expected_.size()));
  const double done = std::accumulate(begin, at, 0.0);
  const double left = std::accumulate(at, expected_.end(), 0.0);
  return done > 0 ? left * (elapsed / done) : left;
}

void progress::start(std::size_t index, std::string_view note) {
  if (index >= announced_.size() || announced_[index]) return;
  announced_[index] = true;
  const auto now = std::chrono::steady_clock::now();
  if (!started_) started_ = now;
  if (out_ == nullptr) return;
  const double elapsed = std::chrono::duration<double>(now - *started_).count();
  *out_ << '[' << index + 1 << '/' << names_.size() << "] " << names_[index];
  if (!note.empty()) *out_ << "  (" << note << ')';
  *out_ << "  ETA " << format_duration(eta_seconds(index, elapsed)) << std::endl;
}

}  // namespace mha_bench
