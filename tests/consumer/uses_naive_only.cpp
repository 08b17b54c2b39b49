// Links mha::naive alone: the accessor, no registry.
#include <cmath>
#include <cstdio>
#include <vector>

#include "mha/backends/naive.hpp"

int main() {
  const mha::config cfg{.d_in = 8, .d_out = 8, .n_heads = 2, .context_length = 4};
  const auto plan = mha::naive_backend().prepare(cfg, mha::formulation::split_weight,
                                                 mha::weights::random(cfg, 1));
  std::vector<float> x(4 * 8, 0.25f), y(4 * 8);
  plan->run({x.data(), 1, 4, 8}, {y.data(), 1, 4, 8});
  for (float v : y) {
    if (!std::isfinite(v)) return 1;
  }
  std::printf("naive: y[0] = %g\n", static_cast<double>(y[0]));
  return y[0] != 0.0f ? 0 : 1;
}
