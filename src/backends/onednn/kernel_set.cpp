#include "backends/onednn/kernel_set.hpp"

#include <algorithm>

#include "backends/onednn/attention.hpp"

namespace mha::detail {
namespace {

std::byte* bytes(scratch_pool::lease& scratch, std::size_t offset) {
  return reinterpret_cast<std::byte*>(scratch.data() + offset);
}

}  // namespace

packed_linear onednn_kernel_set::pack(const linear_weights& w) const {
  return rethrowing_dnnl_errors([&] { return text("packing a (", w.out, ", ", w.in, ") layer"); },
                                [&] { return pack_linear(cpu_engine(), w, bf16_); });
}

void onednn_kernel_set::linear(const packed_linear& w, const float* x, std::int64_t rows,
                               float* y) const {
  rethrowing_dnnl_errors(
      [&] { return text("in a (", rows, " rows) projection"); },
      [&] {
        const auto step = primitives_.linear(w, rows);
        const layer_input in = input_of(w, rows);
        scratch_pool::lease scratch(
            scratch_, in.floats + floats_holding(
                                      std::max(scratchpad_bytes(step->pd), in.scratchpad_bytes())));
        std::byte* scratchpad = bytes(scratch, in.floats);
        dnnl::stream& stream = caller_stream();
        const void* src = in.convert(stream, x, scratch.data(), scratchpad);
        step->run(stream, src, w.weight_data(), w.bias_data(), y, nullptr, scratchpad);
        stream.wait();
      });
}

std::optional<head_view<const float>> onednn_kernel_set::project_heads(
    const packed_linear& w, const float* x, std::int64_t batch, std::int64_t seq_len,
    std::int64_t heads, float* y) const {
  if (heads == 1) return std::nullopt;
  const std::int64_t rows = batch * seq_len, width = w.weights.get_desc().dims()[1];
  const std::int64_t hd = width / heads;
  rethrowing_dnnl_errors(
      [&] { return text("in a (", rows, " rows) head projection"); },
      [&] {
        const auto step = primitives_.linear(w, rows);
        const layer_input in = input_of(w, rows);
        const auto split = primitives_.head_split(batch, seq_len, heads, hd);
        const std::size_t staging = static_cast<std::size_t>(rows * width);
        const std::size_t pad = floats_holding(std::max(
            {scratchpad_bytes(step->pd), scratchpad_bytes(split->pd), in.scratchpad_bytes()}));
        scratch_pool::lease scratch(scratch_, staging + in.floats + pad);
        float* projected = scratch.data();
        std::byte* scratchpad = bytes(scratch, staging + in.floats);
        dnnl::stream& stream = caller_stream();
        const void* src = in.convert(stream, x, projected + staging, scratchpad);
        step->run(stream, src, w.weight_data(), w.bias_data(), projected, nullptr, scratchpad);
        split->run(stream, projected, y, scratchpad);
        stream.wait();
      });
  return head_view<const float>{y, heads * seq_len * hd, seq_len * hd, hd};
}

void onednn_kernel_set::attention(const attention_args& a) const {
  onednn_attention(a, primitives_, scratch_);
}

std::size_t onednn_kernel_set::layer_input::scratchpad_bytes() const {
  return rounding ? detail::scratchpad_bytes(rounding->pd) : 0;
}

const void* onednn_kernel_set::layer_input::convert(dnnl::stream& stream, const float* x,
                                                    float* staging, std::byte* scratchpad) const {
  if (!rounding) return x;
  rounding->run(stream, x, staging, scratchpad);
  return staging;
}

onednn_kernel_set::layer_input onednn_kernel_set::input_of(const packed_linear& w,
                                                           std::int64_t rows) const {
  if (!w.bf16) return {};
  const std::int64_t in = w.weights.get_desc().dims()[0];
  return {primitives_.to_bf16({rows, in}, {in, 1}), static_cast<std::size_t>((rows * in + 1) / 2)};
}

}  // namespace mha::detail
