// The points of a benchmark preset, and those of one series: shared by the sweep's suites
// (test_bench_sweep.cpp, test_bench_presets.cpp).
#pragma once

#include <algorithm>
#include <string>
#include <string_view>
#include <vector>

#include "sweep.hpp"

namespace mha_test {

inline std::vector<mha_bench::sweep_point> points_of(std::string_view preset,
                                                     int hardware_threads = 2) {
  return mha_bench::expand(mha_bench::preset(preset, hardware_threads)).points;
}

inline std::vector<mha_bench::sweep_point> in_series(
    const std::vector<mha_bench::sweep_point>& points, const std::string& s) {
  std::vector<mha_bench::sweep_point> out;
  for (const mha_bench::sweep_point& p : points) {
    if (std::find(p.series.begin(), p.series.end(), s) != p.series.end()) out.push_back(p);
  }
  return out;
}

}  // namespace mha_test
