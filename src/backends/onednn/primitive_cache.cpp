#include "backends/onednn/primitive_cache.hpp"

#include <algorithm>

#include "backends/onednn/runtime.hpp"

namespace mha::detail {

std::shared_ptr<const matmul_step> primitive_caches::linear(const packed_linear& layer,
                                                            std::int64_t rows) const {
  const dnnl::memory::dims dims = layer.weights.get_desc().dims();
  return linear_.get(linear_key{rows, dims[0], dims[1], layer.bias_data() != nullptr, team_size()},
                     [&] { return make_linear(cpu_engine(), rows, layer); });
}

std::shared_ptr<const reorder_step> primitive_caches::head_split(std::int64_t batch,
                                                                 std::int64_t seq_len,
                                                                 std::int64_t heads,
                                                                 std::int64_t head_dim) const {
  return head_split_.get(head_split_key{batch, seq_len, heads, head_dim, team_size()}, [&] {
    return make_head_split(cpu_engine(), batch, seq_len, heads, head_dim);
  });
}

std::shared_ptr<const attention_steps> primitive_caches::attention(
    const attention_geometry& g) const {
  return attention_.get(attention_key{g, team_size()},
                        [&] { return attention_steps(cpu_engine(), g); });
}

std::shared_ptr<const reorder_step> primitive_caches::to_bf16(
    const dnnl::memory::dims& dims, const dnnl::memory::dims& strides) const {
  return to_bf16_.get(to_bf16_key{dims, strides, team_size()},
                      [&] { return make_to_bf16(cpu_engine(), dims, strides); });
}

std::vector<std::string> primitive_caches::implementations(std::int64_t batch,
                                                           std::int64_t seq_len) const {
  std::vector<std::string> out;
  linear_.for_each([&](const linear_key& k, const matmul_step& step) {
    if (k.rows == batch * seq_len) out.push_back(describe("projection", step.pd));
  });
  head_split_.for_each([&](const head_split_key& k, const reorder_step& step) {
    if (k.batch == batch && k.seq_len == seq_len) out.push_back(describe("head_split", step.pd));
  });
  attention_.for_each([&](const attention_key& k, const attention_steps& steps) {
    if (k.geometry.positions == seq_len) steps.describe(out);
  });
  return out;
}

std::vector<int> primitive_caches::team_sizes(std::int64_t batch, std::int64_t seq_len) const {
  std::vector<int> out;
  linear_.for_each([&](const linear_key& k, const matmul_step&) {
    if (k.rows == batch * seq_len && std::ranges::find(out, k.threads) == out.end())
      out.push_back(k.threads);
  });
  return out;
}

}  // namespace mha::detail
