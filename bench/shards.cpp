// Sharding a selection of benchmarks (--shard I/N) and the time budget (--budget).
#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <string>
#include <vector>

#include "mha/error.hpp"
#include "printed.hpp"
#include "progress.hpp"
#include "sweep.hpp"

namespace mha_bench {

shard parse_shard(std::string_view text) {
  const auto bad = [&]() -> shard {
    throw mha::invalid_argument("mha_bench: --shard '" + std::string(text) +
                                "': expected I/N with 1 <= I <= N, e.g. 2/4");
  };
  const std::size_t slash = text.find('/');
  if (slash == std::string_view::npos) return bad();
  const auto number = [&](std::string_view part, int& value) {
    const auto [end, ec] = std::from_chars(part.data(), part.data() + part.size(), value);
    return !part.empty() && ec == std::errc() && end == part.data() + part.size();
  };
  shard s;
  if (!number(text.substr(0, slash), s.index) || !number(text.substr(slash + 1), s.count) ||
      s.count < 1 || s.index < 1 || s.index > s.count) {
    return bad();
  }
  return s;
}

std::string to_string(shard s) { return std::to_string(s.index) + "/" + std::to_string(s.count); }

std::int64_t shard_cost(const bench_case& c) {
  // A nominal machine: the partition must not depend on the one it is computed on.
  constexpr double nominal_gflops_per_thread = 10.0, nominal_min_time = 0.5;
  const double run = mha::flops(c.problem) * 1e-9 / (nominal_gflops_per_thread * c.threads);
  return std::llround(expected_wall_seconds(run, nominal_min_time, 1) * 1e6);
}

std::vector<int> assign_shards(std::span<const bench_case> cases, int count) {
  if (count < 1) {
    throw mha::invalid_argument("mha_bench: a selection cannot be split into " +
                                std::to_string(count) + " shards");
  }
  std::vector<std::string> names;
  std::vector<std::int64_t> costs;
  for (const bench_case& c : cases) {
    names.push_back(c.name());
    costs.push_back(shard_cost(c));
  }
  std::vector<std::size_t> order(cases.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  // Longest first, then by name: the greedy "least loaded shard" rule balances best that way.
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    if (costs[a] != costs[b]) return costs[a] > costs[b];
    return names[a] < names[b];
  });
  std::vector<std::int64_t> load(static_cast<std::size_t>(count), 0);
  std::vector<int> assignment(cases.size(), 0);
  for (std::size_t i : order) {
    const auto least = std::min_element(load.begin(), load.end());  // the first of equals
    assignment[i] = static_cast<int>(least - load.begin());
    *least += costs[i];
  }
  return assignment;
}

std::vector<bench_case> cases_of_shard(std::span<const bench_case> cases, shard s) {
  const std::vector<int> assignment = assign_shards(cases, s.count);
  std::vector<bench_case> out;
  for (std::size_t i = 0; i < cases.size(); ++i) {
    if (assignment[i] == s.index - 1) out.push_back(cases[i]);
  }
  return out;
}

std::string selection_fingerprint(std::span<const bench_case> cases) {
  std::vector<std::string> names;
  for (const bench_case& c : cases) names.push_back(c.name());
  std::sort(names.begin(), names.end());
  std::uint64_t hash = 14695981039346656037ull;  // FNV-1a 64
  const auto add = [&](unsigned char byte) {
    hash ^= byte;
    hash *= 1099511628211ull;
  };
  for (const std::string& name : names) {
    for (char ch : name) add(static_cast<unsigned char>(ch));
    add('\n');
  }
  char buffer[17];
  std::snprintf(buffer, sizeof buffer, "%016llx", static_cast<unsigned long long>(hash));
  return buffer;
}

expansion shard_points(const expansion& e, std::span<const bench_case> cases, shard s) {
  const std::vector<int> assignment = assign_shards(cases, s.count);
  std::vector<bench_case> mine, earlier;
  for (std::size_t i = 0; i < cases.size(); ++i) {
    if (assignment[i] == s.index - 1) mine.push_back(cases[i]);
    if (assignment[i] < s.index - 1) earlier.push_back(cases[i]);
  }
  expansion out = covered_points(e, mine);
  const expansion taken = covered_points(e, earlier);
  std::erase_if(out.points, [&](const sweep_point& p) {
    return std::ranges::any_of(taken.points, [&](const sweep_point& q) {
      return q.problem == p.problem && q.threads == p.threads;
    });
  });
  return out;
}

double estimated_seconds(const bench_case& c, double gflops_one_thread) {
  return mha::flops(c.problem) * 1e-9 / (gflops_one_thread * c.threads);
}

std::optional<std::string> budget_skip_reason(double seconds, double budget_seconds) {
  if (budget_seconds <= 0 || seconds <= budget_seconds) return std::nullopt;
  return "over budget: estimated " + printed("%.3g", seconds) + " s per forward pass > --budget " +
         printed("%.3g", budget_seconds) + " s";
}

}  // namespace mha_bench
