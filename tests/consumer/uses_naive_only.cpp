// Links mha::naive alone: the accessor, no registry; weights through a safetensors state_dict
// (io lives in mha::base, its JSON dependency stays inside the library).
#include <cmath>
#include <cstdio>
#include <vector>

#include "mha/backends/naive.hpp"
#include "mha/io.hpp"

int main() {
  const mha::config cfg{.d_in = 8, .d_out = 8, .n_heads = 2, .context_length = 4};
  const auto state_dict = mha::io::safetensors_bytes(
      mha::io::to_state_dict(cfg, mha::weights::random(cfg, 1), mha::formulation::wrapper));
  const mha::io::loaded_module m =
      mha::io::module_from_state_dict(mha::io::parse_safetensors(state_dict));
  const auto plan = mha::naive_backend().prepare(m.cfg, mha::formulation::split_weight, m.w);
  std::vector<float> x(4 * 8, 0.25f), y(4 * 8);
  plan->run({x.data(), 1, 4, 8}, {y.data(), 1, 4, 8});
  for (float v : y) {
    if (!std::isfinite(v)) return 1;
  }
  std::printf("naive: y[0] = %g\n", static_cast<double>(y[0]));
  return y[0] != 0.0f ? 0 : 1;
}
