#include "backends/onednn/primitives.hpp"

#include <algorithm>
#include <limits>
#include <unordered_map>

#include "base/bf16.hpp"

namespace mha::detail {
namespace {

using dt = dnnl::memory::data_type;
using tag = dnnl::memory::format_tag;
using dims = dnnl::memory::dims;

dnnl::primitive_attr user_scratchpad() {
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  return attr;
}

dnnl::memory view(const dnnl::memory::desc& md, const dnnl::engine& engine, const void* data) {
  // oneDNN takes a non-const handle for every argument; it only writes to destinations.
  return {md, engine, const_cast<void*>(data)};
}

matmul_step make_matmul(const dnnl::engine& engine, const dnnl::matmul::desc& desc,
                        const dnnl::primitive_attr& attr) {
  dnnl::matmul::primitive_desc pd(desc, attr, engine);
  return {pd, dnnl::matmul(pd)};
}

reorder_step make_reorder(const dnnl::engine& engine, const dnnl::memory::desc& from,
                          const dnnl::memory::desc& to) {
  dnnl::reorder::primitive_desc pd(engine, from, engine, to, user_scratchpad());
  return {pd, dnnl::reorder(pd)};
}

// x (rows, in) -> y (rows, out) through `weights` (in, out), plus a (1, out) bias when `bias`;
// x in the weights' data type (f32 or bf16), y and the bias f32.
dnnl::matmul::desc linear_desc(std::int64_t rows, const dnnl::memory::desc& weights, bool bias) {
  const std::int64_t in = weights.dims()[0], out = weights.dims()[1];
  const dnnl::memory::desc x({rows, in}, weights.data_type(), tag::ab),
      b({1, out}, dt::f32, tag::ab), y({rows, out}, dt::f32, tag::ab);
  return bias ? dnnl::matmul::desc(x, weights, b, y) : dnnl::matmul::desc(x, weights, y);
}

// (batch, seq_len, heads * head_dim) row-major, seen as {batch, heads, seq_len, head_dim}.
dnnl::memory::desc token_major(std::int64_t batch, std::int64_t seq_len, std::int64_t heads,
                               std::int64_t head_dim) {
  const std::int64_t width = heads * head_dim;
  return {{batch, heads, seq_len, head_dim}, dt::f32, dims{seq_len * width, head_dim, width, 1}};
}

}  // namespace

void matmul_step::run(dnnl::stream& stream, const void* src, const void* weights, const float* bias,
                      float* dst, const float* post, std::byte* scratchpad) const {
  const dnnl::engine engine = pd.get_engine();
  std::unordered_map<int, dnnl::memory> args{
      {DNNL_ARG_SRC, view(pd.src_desc(), engine, src)},
      {DNNL_ARG_WEIGHTS, view(pd.weights_desc(), engine, weights)},
      {DNNL_ARG_DST, view(pd.dst_desc(), engine, dst)},
      {DNNL_ARG_SCRATCHPAD, view(pd.scratchpad_desc(), engine, scratchpad)}};
  if (bias != nullptr) args.emplace(DNNL_ARG_BIAS, view(pd.bias_desc(), engine, bias));
  if (post != nullptr) {
    const int arg = DNNL_ARG_ATTR_MULTIPLE_POST_OP(0) | DNNL_ARG_SRC_1;
    args.emplace(arg, view(pd.query_md(dnnl::query::exec_arg_md, arg), engine, post));
  }
  primitive.execute(stream, args);
}

packed_linear pack_linear(const dnnl::engine& engine, const linear_weights& w, bool in_bf16) {
  const dnnl::memory::desc plain({w.in, w.out}, dt::f32, tag::ba);  // W (out, in) read as W^T
  // The layout depends on (in, out), not on the row count (checked for rows 1 to 4096), so one
  // row serves to ask. A bf16 layer's reorder rounds W to bf16 on the way (nearest even).
  const dnnl::memory::desc preferred =
      dnnl::matmul::primitive_desc(
          linear_desc(1, dnnl::memory::desc({w.in, w.out}, in_bf16 ? dt::bf16 : dt::f32, tag::any),
                      w.has_bias()),
          user_scratchpad(), engine)
          .weights_desc();
  packed_linear layer{dnnl::memory(preferred, engine), w.bias, in_bf16};
  if (in_bf16) {
    for (float& b : layer.bias) b = round_bf16(b);
  }
  dnnl::memory source = view(plain, engine, w.weight.data());
  dnnl::stream stream(engine);
  dnnl::reorder(source, layer.weights).execute(stream, source, layer.weights);
  stream.wait();
  return layer;
}

matmul_step make_linear(const dnnl::engine& engine, std::int64_t rows, const packed_linear& layer) {
  return make_matmul(engine, linear_desc(rows, layer.weights.get_desc(), !layer.bias.empty()),
                     user_scratchpad());
}

void reorder_step::run(dnnl::stream& stream, const void* src, void* dst,
                       std::byte* scratchpad) const {
  const dnnl::engine engine = pd.get_engine();
  primitive.execute(stream,
                    {{DNNL_ARG_FROM, view(pd.src_desc(), engine, src)},
                     {DNNL_ARG_TO, view(pd.dst_desc(), engine, dst)},
                     {DNNL_ARG_SCRATCHPAD, view(pd.scratchpad_desc(), engine, scratchpad)}});
}

reorder_step make_head_split(const dnnl::engine& engine, std::int64_t batch, std::int64_t seq_len,
                             std::int64_t heads, std::int64_t head_dim) {
  return make_reorder(engine, token_major(batch, seq_len, heads, head_dim),
                      {{batch, heads, seq_len, head_dim}, dt::f32, tag::abcd});
}

reorder_step make_to_bf16(const dnnl::engine& engine, const dims& shape, const dims& strides) {
  dims dense(shape.size(), 1);
  for (std::size_t i = shape.size() - 1; i > 0; --i) dense[i - 1] = dense[i] * shape[i];
  return make_reorder(engine, {shape, dt::f32, strides}, {shape, dt::bf16, dense});
}

attention_steps::attention_steps(const dnnl::engine& engine, const attention_geometry& g) : g_(g) {
  const std::int64_t t = g.rows, n = g.keys, hd = g.head_dim, gr = g.group;
  // A group of one slice has no slice stride: the dense one keeps the descriptors plain, which
  // oneDNN 2.6 runs on brgemm (any other stride, even an unused one, sends it to the slower
  // gemm:jit (measurements: docs/design.md §5.1)).
  const std::int64_t q_stride = g.q_stride > 0 && gr > 1 ? g.q_stride : t * hd,
                     kv_stride = g.kv_stride > 0 && gr > 1 ? g.kv_stride : n * hd;
  const dt operands = g.bf16 ? dt::bf16 : dt::f32;
  const dnnl::memory::desc q({1, gr, t, hd}, operands, dims{gr * q_stride, q_stride, hd, 1});
  // K read as K^T.
  const dnnl::memory::desc kt({1, gr, hd, n}, operands, dims{gr * kv_stride, kv_stride, 1, hd});
  const dnnl::memory::desc v({1, gr, n, hd}, operands, dims{gr * kv_stride, kv_stride, hd, 1});
  const dnnl::memory::desc s({1, gr, t, n}, dt::f32, tag::abcd);
  const dnnl::memory::desc out({1, gr, t, hd}, dt::f32, tag::abcd);

  dnnl::primitive_attr score_attr = user_scratchpad();
  score_attr.set_output_scales(0, {g.scale});
  if (g.causal || g.mask_per_run) {
    if (!g.mask_per_run) {
      // Row r (position r % positions) sees keys up to its position.
      const std::int64_t positions = g.positions > 0 ? g.positions : t;
      mask_ = float_buffer(static_cast<std::size_t>(t * n));
      for (std::int64_t r = 0; r < t; ++r) {
        for (std::int64_t j = 0; j < n; ++j) {
          mask_.data()[r * n + j] =
              j > r % positions ? -std::numeric_limits<float>::infinity() : 0.0f;
        }
      }
    }
    dnnl::post_ops ops;
    ops.append_binary(dnnl::algorithm::binary_add,
                      dnnl::memory::desc({1, 1, t, n}, dt::f32, tag::abcd));
    score_attr.set_post_ops(ops);
  }
  scores_ = make_matmul(engine, dnnl::matmul::desc(q, kt, s), score_attr);

  softmax_pd_ = dnnl::softmax_v2_forward::primitive_desc(
      dnnl::softmax_v2_forward::desc(dnnl::prop_kind::forward_inference,
                                     dnnl::algorithm::softmax_accurate, s, s, /*axis=*/3),
      user_scratchpad(), engine);
  softmax_ = dnnl::softmax_v2_forward(softmax_pd_);

  if (g.bf16) {
    const dnnl::memory::desc p({1, gr, t, n}, dt::bf16, tag::abcd);
    context_ = make_matmul(engine, dnnl::matmul::desc(p, v, out), user_scratchpad());
  } else {
    context_ = make_matmul(engine, dnnl::matmul::desc(s, v, out), user_scratchpad());
  }
}

void attention_steps::run_softmax(dnnl::stream& stream, float* scores,
                                  std::byte* scratchpad) const {
  const dnnl::engine engine = softmax_pd_.get_engine();
  const dnnl::memory s = view(softmax_pd_.src_desc(), engine, scores);
  softmax_.execute(
      stream, {{DNNL_ARG_SRC, s},
               {DNNL_ARG_DST, s},
               {DNNL_ARG_SCRATCHPAD, view(softmax_pd_.scratchpad_desc(), engine, scratchpad)}});
}

std::size_t attention_steps::scratchpad_bytes() const {
  return std::max({detail::scratchpad_bytes(scores_.pd), detail::scratchpad_bytes(context_.pd),
                   detail::scratchpad_bytes(softmax_pd_)});
}

void attention_steps::row_maxima(const float* weights, float* largest) const {
  const std::int64_t n = g_.keys;
  for (std::int64_t r = 0; r < g_.group * g_.rows; ++r) {
    const float* row = weights + r * n;
    float m = row[0];
    for (std::int64_t j = 1; j < n; ++j) m = row[j] > m ? row[j] : m;
    largest[r] = m;
  }
}

void attention_steps::unnormalised_bf16(const float* weights, const float* largest,
                                        std::uint16_t* p) const {
  const std::int64_t n = g_.keys;
  for (std::int64_t r = 0; r < g_.group * g_.rows; ++r) {
    const float inverse = 1.0f / largest[r];
    for (std::int64_t j = 0; j < n; ++j) p[r * n + j] = to_bf16(weights[r * n + j] * inverse);
  }
}

void attention_steps::scale_rows(float* out, const float* largest) const {
  const std::int64_t hd = g_.head_dim;
  for (std::int64_t r = 0; r < g_.group * g_.rows; ++r) {
    for (std::int64_t e = 0; e < hd; ++e) out[r * hd + e] *= largest[r];
  }
}

void attention_steps::describe(std::vector<std::string>& out) const {
  out.push_back(detail::describe("scores", scores_.pd));
  out.push_back(detail::describe("softmax", softmax_pd_));
  out.push_back(detail::describe("context", context_.pd));
}

std::size_t scratchpad_bytes(const dnnl::primitive_desc_base& pd) {
  return pd.scratchpad_desc().get_size();
}

std::string describe(const char* name, const dnnl::primitive_desc_base& pd) {
  return std::string(name) + " " + pd.impl_info_str();
}

}  // namespace mha::detail
