// mha._mha's attention calls: mha.attention's tensors (any strides, float32 or bf16 words),
// its mask and the call over an mha.AttentionCache, each read where it lies and handed to
// mha::attention with the GIL released.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/string_view.h>
#include <nanobind/stl/unique_ptr.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>

#include "bindings.hpp"
#include "mha/mha.hpp"

namespace nb = nanobind;
using namespace nb::literals;
using mha_python::executor_named;
using mha_python::int_arg;

namespace {

// mha.attention's tensors: (batch, heads, rows, head_dim) float32 in CPU memory, any strides
// (the package passes the last dimension contiguous), read or written where they lie.
using heads_input = nb::ndarray<const float, nb::ndim<4>, nb::device::cpu>;
// bfloat16 tensors' memory as 16-bit integers (NumPy has no bfloat16: the package passes
// tensor.view(torch.int16)), read where it lies as mha::bfloat16.
using bf16_heads_input = nb::ndarray<const std::int16_t, nb::ndim<4>, nb::device::cpu>;
using bf16_heads_output = nb::ndarray<std::int16_t, nb::ndim<4>, nb::device::cpu>;
using heads_output = nb::ndarray<float, nb::ndim<4>, nb::device::cpu>;
// Its mask, broadcast to (batch, heads, rows, keys) by the package (strides 0 where it repeats).
using float_mask = nb::ndarray<const float, nb::ndim<4>, nb::device::cpu>;
using bool_mask = nb::ndarray<const bool, nb::ndim<4>, nb::device::cpu>;

// A 4-d array's shape and its first three strides, in elements; its last dimension must be
// contiguous (the package copies one that is not first), unless it holds no element.
struct strided4 {
  std::int64_t shape[4], stride[3];
};
template <class Array>
strided4 strided(const Array& t, const char* what) {
  if (t.size() > 0 && t.shape(3) > 1 && t.stride(3) != 1) {
    throw mha::invalid_argument(std::string("mha.attention: ") + what +
                                "'s last dimension is not contiguous (stride " +
                                std::to_string(t.stride(3)) + " elements, expected 1)");
  }
  strided4 s{};
  for (std::size_t i = 0; i < 4; ++i) s.shape[i] = static_cast<std::int64_t>(t.shape(i));
  for (std::size_t i = 0; i < 3; ++i) s.stride[i] = static_cast<std::int64_t>(t.stride(i));
  return s;
}

template <class Array>
auto heads_of(const Array& t, const char* what) {
  const strided4 s = strided(t, what);
  return mha::heads_view<std::remove_pointer_t<decltype(t.data())>>{
      t.data(),   s.shape[0],  s.shape[1],  s.shape[2],
      s.shape[3], s.stride[0], s.stride[1], s.stride[2]};
}

template <class Array>
auto bf16_heads_of(const Array& t, const char* what) {
  static_assert(sizeof(mha::bfloat16) == sizeof(std::int16_t));
  const auto words = heads_of(t, what);
  using bf16 = std::conditional_t<std::is_const_v<std::remove_pointer_t<decltype(t.data())>>,
                                  const mha::bfloat16, mha::bfloat16>;
  return mha::heads_view<bf16>{reinterpret_cast<bf16*>(words.data),
                               words.batch,
                               words.heads,
                               words.rows,
                               words.head_dim,
                               words.batch_stride,
                               words.head_stride,
                               words.row_stride};
}

template <class Array>
mha::attention_mask mask_of(const Array& m, mha::attention_mask::kind kind) {
  const strided4 s = strided(m, "the mask");
  return {kind,       m.data(),    s.shape[0],  s.shape[1], s.shape[2],
          s.shape[3], s.stride[0], s.stride[1], s.stride[2]};
}

// q, k and v of Input: float32 (computed in fp32, or in bf16 when `bf16`) into float32, or
// bfloat16's words (always bf16) into bfloat16's words.
template <class Input, class Output>
void attention_call(const Input& q, const Input& k, const Input& v, const Output& out,
                    const std::optional<float_mask>& additive,
                    const std::optional<bool_mask>& boolean, bool causal, bool bottom_right,
                    std::optional<float> scale, bool bf16,
                    const std::optional<std::string>& backend, int threads,
                    const std::optional<std::string>& executor) {
  mha::attention_options o;
  o.causal = causal;
  o.alignment =
      bottom_right ? mha::causal_alignment::bottom_right : mha::causal_alignment::top_left;
  o.scale = scale;
  o.precision = bf16 ? mha::precision::bf16 : mha::precision::fp32;
  o.threads = threads;
  o.executor = executor_named(executor);
  if (additive) o.mask = mask_of(*additive, mha::attention_mask::kind::additive);
  if (boolean) o.mask = mask_of(*boolean, mha::attention_mask::kind::boolean);
  const mha::backend& b = backend ? mha::require_backend(*backend) : mha::default_backend();
  if constexpr (std::is_same_v<Input, bf16_heads_input>) {
    const auto qv = bf16_heads_of(q, "query"), kv = bf16_heads_of(k, "key"),
               vv = bf16_heads_of(v, "value");
    const auto ov = bf16_heads_of(out, "out");
    nb::gil_scoped_release unlocked;
    mha::attention(b, qv, kv, vv, ov, o);
  } else {
    const auto qv = heads_of(q, "query"), kv = heads_of(k, "key"), vv = heads_of(v, "value");
    const auto ov = heads_of(out, "out");
    nb::gil_scoped_release unlocked;
    mha::attention(b, qv, kv, vv, ov, o);
  }
}

}  // namespace

void mha_python::bind_attention(nb::module_& m) {
  // mha.attention's call (python/mha/_attention.py checks and shapes its arguments first).
  m.def("_attention", &attention_call<heads_input, heads_output>, "q"_a, "k"_a, "v"_a, "out"_a,
        "additive"_a.none(), "boolean"_a.none(), "causal"_a, "bottom_right"_a, "scale"_a.none(),
        "bf16"_a, "backend"_a.none(), "threads"_a, "executor"_a.none());
  m.def("_attention_bf16", &attention_call<bf16_heads_input, bf16_heads_output>, "q"_a, "k"_a,
        "v"_a, "out"_a, "additive"_a.none(), "boolean"_a.none(), "causal"_a, "bottom_right"_a,
        "scale"_a.none(), "bf16"_a, "backend"_a.none(), "threads"_a, "executor"_a.none());
  // mha.AttentionCache's cache and mha.attention's call over it (python/mha/_cache.py checks
  // the arguments first; the library names what it refuses).
  m.def(
      "_make_attention_cache",
      [](const std::optional<std::string>& backend, int_arg batch, int_arg capacity,
         int_arg kv_heads, int_arg head_dim, std::string_view kv, std::string_view precision) {
        constexpr std::string_view where = "mha.AttentionCache";
        const mha::backend& b = backend ? mha::require_backend(*backend) : mha::default_backend();
        return mha::make_attention_cache(
            b, batch.get(where, "batch"), capacity.get(where, "capacity"),
            kv_heads.get(where, "kv_heads"), head_dim.get(where, "head_dim"),
            mha::parse_precision(kv), mha::parse_precision(precision));
      },
      "backend"_a.none(), "batch"_a, "capacity"_a, "kv_heads"_a, "head_dim"_a, "kv"_a,
      "precision"_a);
  m.def(
      "_attention_over_cache",
      [](const heads_input& q, const heads_input& k, const heads_input& v, mha::kv_cache& cache,
         const heads_output& out, bool causal, std::optional<float> scale, bool bf16,
         const std::optional<std::string>& backend, int threads,
         const std::optional<std::string>& executor, int_arg first_sequence) {
        mha::attention_options o;
        o.causal = causal;
        o.scale = scale;
        o.precision = bf16 ? mha::precision::bf16 : mha::precision::fp32;
        const std::int64_t first = first_sequence.get("mha.attention", "first_sequence");
        o.threads = threads;
        o.executor = executor_named(executor);
        const mha::backend& b = backend ? mha::require_backend(*backend) : mha::default_backend();
        const auto qv = heads_of(q, "query"), kv = heads_of(k, "key"), vv = heads_of(v, "value");
        const auto ov = heads_of(out, "out");
        nb::gil_scoped_release unlocked;
        mha::attention(b, qv, kv, vv, cache, ov, o, first);
      },
      "q"_a, "k"_a, "v"_a, "cache"_a, "out"_a, "causal"_a, "scale"_a.none(), "bf16"_a,
      "backend"_a.none(), "threads"_a, "executor"_a.none(), "first_sequence"_a);
}
