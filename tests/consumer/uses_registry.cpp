// Links mha::mha: picks every available backend by name at run time; all agree.
#include <cmath>
#include <cstdio>
#include <vector>

#include "mha/mha.hpp"

int main() {
  const mha::config cfg{.d_in = 8, .d_out = 8, .n_heads = 2, .context_length = 4};
  const mha::weights w = mha::weights::random(cfg, 1);
  std::vector<float> x(4 * 8, 0.25f), reference(4 * 8);
  mha::naive_backend()
      .prepare(cfg, mha::formulation::wrapper, w)
      ->run({x.data(), 1, 4, 8}, {reference.data(), 1, 4, 8});
  for (const mha::backend* b : mha::available_backends()) {
    std::vector<float> y(4 * 8);
    mha::require_backend(b->name())
        .prepare(cfg, mha::formulation::split_weight, w)
        ->run({x.data(), 1, 4, 8}, {y.data(), 1, 4, 8});
    for (std::size_t i = 0; i < y.size(); ++i) {
      if (!(std::abs(y[i] - reference[i]) <= 1e-5f)) {
        std::printf("%s disagrees at %zu\n", std::string(b->name()).c_str(), i);
        return 1;
      }
    }
    std::printf("%s: ok\n", std::string(b->name()).c_str());
  }
  return 0;
}
