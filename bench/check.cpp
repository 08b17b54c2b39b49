#include "check.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>

#include "mha/io.hpp"

namespace mha_bench {
namespace {

constexpr std::uint64_t weight_seed = 42;
constexpr std::uint32_t input_seed = 7;

std::vector<float> random_input(const mha::problem& p) {
  std::mt19937 generator(input_seed);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  std::vector<float> x(static_cast<std::size_t>(p.batch * p.seq_len * p.cfg.d_in));
  for (float& e : x) e = uniform(generator);
  return x;
}

}  // namespace

std::vector<mha_reference::row> sample_rows(std::int64_t batch, std::int64_t seq_len) {
  std::vector<mha_reference::row> rows;
  for (std::int64_t b : {std::int64_t{0}, batch - 1}) {
    for (std::int64_t t : {std::int64_t{0}, seq_len / 3, 2 * seq_len / 3, seq_len - 1}) {
      const bool seen = std::any_of(rows.begin(), rows.end(), [&](const mha_reference::row& r) {
        return r.batch == b && r.token == t;
      });
      if (!seen) rows.push_back({b, t});
    }
  }
  return rows;
}

double check_result::relative_error() const noexcept {
  return max_reference > 0 ? max_error / max_reference : max_error;
}

bool check_result::passed(double tolerance) const noexcept {
  return max_error <= tolerance * max_reference;  // NaN compares false
}

check_result compare_rows(std::span<const float> y, std::int64_t seq_len, std::int64_t d_out,
                          std::span<const mha_reference::row> rows,
                          std::span<const double> reference) {
  check_result result{.rows = rows.size()};
  for (std::size_t r = 0; r < rows.size(); ++r) {
    const float* out = y.data() + (rows[r].batch * seq_len + rows[r].token) * d_out;
    const double* expected = reference.data() + static_cast<std::ptrdiff_t>(r) * d_out;
    for (std::int64_t e = 0; e < d_out; ++e) {
      const double error = std::abs(static_cast<double>(out[e]) - expected[e]);
      if (std::isnan(error)) result.max_error = std::numeric_limits<double>::quiet_NaN();
      if (!std::isnan(result.max_error)) result.max_error = std::max(result.max_error, error);
      result.max_reference = std::max(result.max_reference, std::abs(expected[e]));
    }
  }
  return result;
}

shape_fixture::shape_fixture(const mha::problem& shape)
    : problem_(shape),
      weights_(mha::weights::random(shape.cfg, weight_seed)),
      x_(random_input(shape)),
      rows_(sample_rows(shape.batch, shape.seq_len)),
      reference_(mha_reference::forward_rows(shape.cfg, weights_, x_, shape.batch, shape.seq_len,
                                             rows_, {}, shape.past)) {
  if (mha::coded(shape.cache_precision())) {
    mha::config exact = shape.cfg;
    exact.precision = mha::precision::fp32;
    double max_reference = 0;
    for (const double v : reference_) max_reference = std::max(max_reference, std::abs(v));
    if (max_reference > 0) {
      int8_cache_tolerance_ =
          mha_reference::int8_cache_bound(exact, weights_, x_, shape.batch * shape.seq_len,
                                          max_reference, shape.cache_precision()) /
          max_reference;
    }
  }
}

check_result shape_fixture::check(std::span<const float> y) const {
  return compare_rows(y, problem_.seq_len, problem_.cfg.d_out, rows_, reference_);
}

void write_fixture(const shape_fixture& fixture, const std::filesystem::path& path) {
  const mha::problem& p = fixture.problem();
  mha::io::tensor_file file =
      mha::io::to_state_dict(p.cfg, fixture.weights(), mha::io::layout::split);
  const auto x = fixture.x();
  file.tensors["x"] = {{p.batch, p.seq_len, p.cfg.d_in}, {x.begin(), x.end()}};
  const auto rows = fixture.rows();
  const auto count = static_cast<std::int64_t>(rows.size());
  mha::io::tensor& where = file.tensors["check.rows"] = {{count, 2}, {}};
  for (const mha_reference::row& r : rows) {
    where.values.push_back(static_cast<float>(r.batch));
    where.values.push_back(static_cast<float>(r.token));
  }
  mha::io::tensor& reference = file.tensors["check.reference"] = {{count, p.cfg.d_out}, {}};
  for (const double v : fixture.reference()) reference.values.push_back(static_cast<float>(v));
  file.metadata["problem"] = shape_name(p);
  mha::io::write_safetensors(path, file);
}

}  // namespace mha_bench
