// Links mha::xsimd alone: its accessors and ISA knobs, no registry, no xsimd headers needed.
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "mha/backends/xsimd.hpp"

int main() {
  const mha::config cfg{.d_in = 8, .d_out = 8, .n_heads = 2, .context_length = 4};
  const mha::weights w = mha::weights::random(cfg, 1);
  std::vector<float> x(4 * 8, 0.25f);
  for (mha::isa isa : mha::xsimd_supported_isas()) {
    const mha::backend& backend = mha::xsimd_backend(isa);
    std::vector<float> y(4 * 8);
    backend.prepare(cfg, mha::formulation::split_weight, w)
        ->run({x.data(), 1, 4, 8}, {y.data(), 1, 4, 8});
    for (float v : y) {
      if (!std::isfinite(v) || v == 0.0f) return 1;
    }
    std::printf("%s: y[0] = %g\n", backend.description().c_str(), static_cast<double>(y[0]));
  }
  return 0;
}
