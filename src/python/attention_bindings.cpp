// mha._mha's attention calls: mha.attention's tensors (any strides, float32 or bf16 words),
// its mask and the call over an mha.AttentionCache, each read where it lies and handed to
// mha::attention with the GIL released.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/array.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/string_view.h>
#include <nanobind/stl/unique_ptr.h>

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>

#include "bindings.hpp"
#include "mha/mha.hpp"

namespace nb = nanobind;
using namespace nb::literals;
using mha_python::backend_named;
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

// A call's sinks: one float32 logit per query head, contiguous (the package makes them so).
using sink_array = nb::ndarray<const float, nb::ndim<1>, nb::device::cpu, nb::c_contig>;

// The function's extensions as the package passes them (docs/design.md §1.9): a window (0:
// none), a soft-cap (0: none) and the sinks (None: none); the library checks their values.
struct extensions {
  std::int64_t window = 0;
  float softcap = 0.0f;
  const std::optional<sink_array>& sinks;

  void set(mha::attention_options& o) const {
    o.window = window;
    o.softcap = softcap;
    if (sinks) o.sinks = {sinks->data(), sinks->shape(0)};
  }
};

// A call's options as the package passes them.
mha::attention_options call_options(bool causal, bool bottom_right, std::optional<float> scale,
                                    bool bf16, int threads,
                                    const std::optional<std::string>& executor,
                                    const extensions& more) {
  mha::attention_options o;
  o.causal = causal;
  o.alignment =
      bottom_right ? mha::causal_alignment::bottom_right : mha::causal_alignment::top_left;
  o.scale = scale;
  o.precision = bf16 ? mha::precision::bf16 : mha::precision::fp32;
  o.threads = threads;
  o.executor = executor_named(executor);
  more.set(o);
  return o;
}

// q, k and v of Input: float32 (computed in fp32, or in bf16 when `bf16`) into float32, or
// bfloat16's words (always bf16) into bfloat16's words.
template <class Input, class Output>
void attention_call(const Input& q, const Input& k, const Input& v, const Output& out,
                    const std::optional<float_mask>& additive,
                    const std::optional<bool_mask>& boolean, bool causal, bool bottom_right,
                    std::optional<float> scale, bool bf16,
                    const std::optional<std::string>& backend, int threads,
                    const std::optional<std::string>& executor, std::int64_t window, float softcap,
                    const std::optional<sink_array>& sinks) {
  mha::attention_options o =
      call_options(causal, bottom_right, scale, bf16, threads, executor, {window, softcap, sinks});
  if (additive) o.mask = mask_of(*additive, mha::attention_mask::kind::additive);
  if (boolean) o.mask = mask_of(*boolean, mha::attention_mask::kind::boolean);
  const mha::backend& b = backend_named(backend);
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

// The plain call from PyTorch, read without NumPy (a tensor's .numpy() costs ~2 us, a decode
// step makes one call per layer): the torch objects it compares against, looked up once (torch
// is loaded: the caller passed its tensors) and kept for the process's life.
struct torch_objects {
  PyObject *tensor, *float32, *bfloat16, *strided, *empty_like, *contiguous_format;
  PyObject *is_grad_enabled, *is_inference_mode_enabled, *increment_version;
  PyObject *memory_format_keyword, *is_cpu, *requires_grad, *dtype, *layout, *shape, *stride,
      *data_ptr, *is_neg, *is_inference, *untyped_storage;
};

const torch_objects* make_torch_objects() {
  const nb::module_ torch = nb::module_::import_("torch");
  const auto keep = [&](const char* name) { return nb::object(torch.attr(name)).release().ptr(); };
  const auto name = [](const char* s) { return PyUnicode_InternFromString(s); };
  // torch._C._increment_version(tensors): what torch.autograd.graph.increment_version calls.
  PyObject* increment = nb::object(torch.attr("_C").attr("_increment_version")).release().ptr();
  return new torch_objects{keep("Tensor"),
                           keep("float32"),
                           keep("bfloat16"),
                           keep("strided"),
                           keep("empty_like"),
                           keep("contiguous_format"),
                           keep("is_grad_enabled"),
                           keep("is_inference_mode_enabled"),
                           increment,
                           nb::make_tuple("memory_format").release().ptr(),
                           name("is_cpu"),
                           name("requires_grad"),
                           name("dtype"),
                           name("layout"),
                           name("shape"),
                           name("stride"),
                           name("data_ptr"),
                           name("is_neg"),
                           name("is_inference"),
                           name("untyped_storage")};
}

const torch_objects& torch_api() {
  // Made under the GIL, not behind a function-local static's guard: a thread waiting on that
  // guard while holding the GIL would deadlock with one that makes the objects and waits for the
  // GIL. Two threads may both make them (if the import lets the GIL go): one copy then leaks.
  static const torch_objects* api = nullptr;
  if (api == nullptr) api = make_torch_objects();
  return *api;
}

// A 4-d tensor's shape or strides.
using shape4 = std::array<std::int64_t, 4>;

// A tensor as the plain call reads it: a torch.Tensor (not a subclass: those may redefine what
// a call on them means) in CPU memory, strided, float32 or bfloat16 without the negative bit,
// 4-d with no empty dimension, the last contiguous. `storage` holds its memory for the call: a
// tensor another thread set_()s to other memory meanwhile frees its old storage only once the
// call has let go of it.
struct plain_tensor {
  void* data = nullptr;
  shape4 shape = {}, stride = {};
  bool bf16 = false, requires_grad = false;
  nb::object storage;
};

// An attribute's (or a method's result's) new reference; nullptr with the error cleared.
PyObject* get(PyObject* t, PyObject* name, bool call = false) {
  PyObject* r = call ? PyObject_CallMethodNoArgs(t, name) : PyObject_GetAttr(t, name);
  if (r == nullptr) PyErr_Clear();
  return r;
}

bool is_object(PyObject* t, PyObject* name, PyObject* expected, bool call = false) {
  PyObject* r = get(t, name, call);
  Py_XDECREF(r);
  return r == expected;
}

// A 4-tuple of ints (torch.Size, or stride()'s tuple) into v; false on anything else.
bool four_ints(PyObject* tuple, shape4& v) {
  if (tuple == nullptr || !PyTuple_Check(tuple) || PyTuple_GET_SIZE(tuple) != 4) return false;
  for (Py_ssize_t i = 0; i < 4; ++i) {
    v[i] = PyLong_AsLongLong(PyTuple_GET_ITEM(tuple, i));
    if (v[i] == -1 && PyErr_Occurred()) {
      PyErr_Clear();
      return false;
    }
  }
  return true;
}

std::optional<plain_tensor> plain(PyObject* t, const torch_objects& torch) {
  if (Py_TYPE(t) != reinterpret_cast<PyTypeObject*>(torch.tensor)) return std::nullopt;
  if (!is_object(t, torch.is_cpu, Py_True) || !is_object(t, torch.layout, torch.strided) ||
      !is_object(t, torch.is_neg, Py_False, true)) {
    return std::nullopt;
  }
  plain_tensor p;
  PyObject* dtype = get(t, torch.dtype);
  Py_XDECREF(dtype);
  if (dtype != torch.float32 && dtype != torch.bfloat16) return std::nullopt;
  p.bf16 = dtype == torch.bfloat16;
  PyObject* grad = get(t, torch.requires_grad);
  Py_XDECREF(grad);
  if (grad != Py_False && grad != Py_True) return std::nullopt;
  p.requires_grad = grad == Py_True;
  PyObject* shape = get(t, torch.shape);
  PyObject* stride = get(t, torch.stride, true);
  const bool read = four_ints(shape, p.shape) && four_ints(stride, p.stride);
  Py_XDECREF(shape);
  Py_XDECREF(stride);
  if (!read || (p.shape[3] > 1 && p.stride[3] != 1)) return std::nullopt;
  for (const std::int64_t n : p.shape) {
    if (n <= 0) return std::nullopt;
  }
  // The storage before the pointer into it: both read under the GIL, so no set_() between them.
  p.storage = nb::steal(get(t, torch.untyped_storage, true));
  if (!p.storage.is_valid()) return std::nullopt;  // no storage (torch.func's wrappers)
  PyObject* data = get(t, torch.data_ptr, true);
  if (data == nullptr) return std::nullopt;
  p.data = PyLong_AsVoidPtr(data);
  Py_DECREF(data);
  if (p.data == nullptr) {
    PyErr_Clear();
    return std::nullopt;
  }
  return p;
}

template <class T>
mha::heads_view<T> view_of(const plain_tensor& p) {
  return {static_cast<T*>(p.data),
          p.shape[0],
          p.shape[1],
          p.shape[2],
          p.shape[3],
          p.stride[0],
          p.stride[1],
          p.stride[2]};
}

// A new contiguous tensor of the query's shape and dtype:
// torch.empty_like(query, memory_format=torch.contiguous_format); nullptr with the error cleared.
PyObject* empty_like(PyObject* query, const torch_objects& torch) {
  PyObject* args[] = {query, torch.contiguous_format};
  PyObject* r = PyObject_Vectorcall(torch.empty_like, args, 1, torch.memory_format_keyword);
  if (r == nullptr) PyErr_Clear();
  return r;
}

// mha.attention's rule for its operands' shapes (SDPA's): query (B, H, L, D), key and value
// (B, H_kv, S, D) of the same B and D, H_kv == H or, with enable_gqa, dividing it. What it
// refuses, said, or nullopt. Written here alone: plain_call_of declines what it refuses, and the
// package's general path raises it (_check_heads).
std::optional<std::string> heads_refusal(const shape4& q, const shape4& k, const shape4& v,
                                         bool enable_gqa) {
  const auto text = [](const shape4& s) {
    return "(" + std::to_string(s[0]) + ", " + std::to_string(s[1]) + ", " + std::to_string(s[2]) +
           ", " + std::to_string(s[3]) + ")";
  };
  if (k != v || k[0] != q[0] || k[3] != q[3]) {
    return "mha.attention: query " + text(q) + ", key " + text(k) + " and value " + text(v) +
           ": expected query (B, H, L, D) and key, value (B, H_kv, S, D) of the same B and D";
  }
  if (q[1] != k[1] && !(enable_gqa && k[1] > 0 && q[1] % k[1] == 0)) {
    return "mha.attention: query has " + std::to_string(q[1]) + " heads and key " +
           std::to_string(k[1]) + ": " +
           (enable_gqa ? "the query heads must be a multiple of the key heads"
                       : "pass enable_gqa=True for grouped-query attention (as SDPA)");
  }
  return std::nullopt;
}

// The plain call's operands and result: q, k and v plain() and of one dtype, of the shapes
// heads_refusal takes, each key its own row (a key dimension expanded with
// stride 0 is the general path's, which copies it); the result `out` (None: a new contiguous
// tensor of the query's shape and dtype), plain() and of the query's shape and dtype, not an
// inference tensor outside inference mode (torch refuses to write one there: the general path
// names it); with autograd on, no tensor that requires grad. nullopt where any of that does not
// hold. `given` says the caller passed out: its version counter is bumped once written.
struct plain_call {
  plain_tensor q, k, v, out;
  nb::object result;
  bool given = false;
};

std::optional<plain_call> plain_call_of(nb::handle query, nb::handle key, nb::handle value,
                                        nb::handle out, bool enable_gqa) {
  const torch_objects& torch = torch_api();
  const auto q = plain(query.ptr(), torch), k = plain(key.ptr(), torch),
             v = plain(value.ptr(), torch);
  if (!q || !k || !v || k->bf16 != q->bf16 || v->bf16 != q->bf16) return std::nullopt;
  if (k->shape[2] > 1 && (k->stride[2] == 0 || v->stride[2] == 0)) return std::nullopt;
  if (heads_refusal(q->shape, k->shape, v->shape, enable_gqa)) return std::nullopt;
  nb::object result = out.is_none() ? nb::steal(empty_like(query.ptr(), torch)) : nb::borrow(out);
  if (!result.is_valid()) return std::nullopt;
  const auto o = plain(result.ptr(), torch);
  if (!o || o->bf16 != q->bf16) return std::nullopt;
  for (int i = 0; i < 4; ++i) {
    if (o->shape[i] != q->shape[i]) return std::nullopt;
  }
  if (q->requires_grad || k->requires_grad || v->requires_grad || o->requires_grad) {
    // With autograd on, the general path refuses the call (naming the tensor); under no_grad
    // it reads and writes them as here.
    PyObject* on = PyObject_CallNoArgs(torch.is_grad_enabled);
    if (on == nullptr) PyErr_Clear();
    Py_XDECREF(on);
    if (on != Py_False) return std::nullopt;
  }
  const bool given = !out.is_none();
  if (given && is_object(out.ptr(), torch.is_inference, Py_True, true)) {
    PyObject* on = PyObject_CallNoArgs(torch.is_inference_mode_enabled);
    if (on == nullptr) PyErr_Clear();
    Py_XDECREF(on);
    if (on != Py_True) return std::nullopt;
  }
  return plain_call{*q, *k, *v, *o, std::move(result), given};
}

// out's version counter bumped, as torch's own in-place operations do, so that autograd refuses
// a backward() through a tensor it saved and mha then overwrote.
void written(const plain_call& call) {
  if (!call.given) return;
  PyObject* written_tensors = PyTuple_Pack(1, call.result.ptr());
  if (written_tensors == nullptr) throw nb::python_error();
  PyObject* r = PyObject_CallOneArg(torch_api().increment_version, written_tensors);
  Py_DECREF(written_tensors);
  if (r == nullptr) throw nb::python_error();
  Py_DECREF(r);
}

// mha.attention's call on PyTorch tensors without a mask: the result (`out`, or a new
// contiguous tensor of the query's dtype), or None where the call is not plain (plain_call_of):
// the package's general path then makes the call, or names what it refuses, with the same
// results.
nb::object tensor_attention(nb::handle query, nb::handle key, nb::handle value, nb::handle out,
                            bool causal, bool bottom_right, std::optional<float> scale,
                            bool enable_gqa, const std::optional<std::string>& backend, int threads,
                            const std::optional<std::string>& executor, std::int64_t window,
                            float softcap, const std::optional<sink_array>& sinks) {
  const auto call = plain_call_of(query, key, value, out, enable_gqa);
  if (!call) return nb::none();
  const bool bf16 = call->q.bf16;
  const mha::attention_options options =
      call_options(causal, bottom_right, scale, bf16, threads, executor, {window, softcap, sinks});
  const mha::backend& b = backend_named(backend);
  if (bf16) {
    using in = const mha::bfloat16;
    const auto q = view_of<in>(call->q), k = view_of<in>(call->k), v = view_of<in>(call->v);
    const auto o = view_of<mha::bfloat16>(call->out);
    nb::gil_scoped_release unlocked;
    mha::attention(b, q, k, v, o, options);
  } else {
    const auto q = view_of<const float>(call->q), k = view_of<const float>(call->k),
               v = view_of<const float>(call->v);
    const auto o = view_of<float>(call->out);
    nb::gil_scoped_release unlocked;
    mha::attention(b, q, k, v, o, options);
  }
  written(*call);
  return call->result;
}

// The same over an mha.AttentionCache (mha.attention(..., cache=)): float32 tensors only (the
// cache's call takes float32 new tokens: the general path copies bfloat16 ones), causal over
// what each sequence holds. The result a new float32 tensor, or None.
nb::object tensor_attention_over_cache(nb::handle query, nb::handle key, nb::handle value,
                                       mha::kv_cache& cache, bool causal, bool bottom_right,
                                       std::optional<float> scale, bool bf16, bool enable_gqa,
                                       const std::optional<std::string>& backend, int threads,
                                       const std::optional<std::string>& executor,
                                       int_arg first_sequence, std::int64_t window, float softcap,
                                       const std::optional<sink_array>& sinks) {
  const auto call = plain_call_of(query, key, value, nb::none(), enable_gqa);
  if (!call || call->q.bf16) return nb::none();
  const mha::attention_options options =
      call_options(causal, bottom_right, scale, bf16, threads, executor, {window, softcap, sinks});
  const std::int64_t first = first_sequence.get("mha.attention", "first_sequence");
  const mha::backend& b = backend_named(backend);
  const auto q = view_of<const float>(call->q), k = view_of<const float>(call->k),
             v = view_of<const float>(call->v);
  const auto o = view_of<float>(call->out);
  {
    nb::gil_scoped_release unlocked;
    mha::attention(b, q, k, v, cache, o, options, first);
  }
  return call->result;
}

}  // namespace

void mha_python::bind_attention(nb::module_& m) {
  // mha.attention's plain call on PyTorch tensors (no mask), or None: the package's general
  // path below then takes it.
  m.def("_attention_tensors", &tensor_attention, "query"_a, "key"_a, "value"_a, "out"_a.none(),
        "causal"_a, "bottom_right"_a, "scale"_a.none(), "enable_gqa"_a, "backend"_a.none(),
        "threads"_a, "executor"_a.none(), "window"_a = 0, "softcap"_a = 0.0f,
        "sinks"_a.none() = nb::none());
  m.def("_attention_tensors_over_cache", &tensor_attention_over_cache, "query"_a, "key"_a,
        "value"_a, "cache"_a, "causal"_a, "bottom_right"_a, "scale"_a.none(), "bf16"_a,
        "enable_gqa"_a, "backend"_a.none(), "threads"_a, "executor"_a.none(), "first_sequence"_a,
        "window"_a = 0, "softcap"_a = 0.0f, "sinks"_a.none() = nb::none());
  // mha.attention's shape rule, raised for the package's general path (heads_refusal).
  m.def(
      "_check_heads",
      [](const shape4& q, const shape4& k, const shape4& v, bool enable_gqa) {
        if (const auto refusal = heads_refusal(q, k, v, enable_gqa)) {
          throw mha::invalid_argument(*refusal);
        }
      },
      "q"_a, "k"_a, "v"_a, "enable_gqa"_a);
  // mha.attention's call (python/mha/_attention.py checks and shapes its arguments first).
  m.def("_attention", &attention_call<heads_input, heads_output>, "q"_a, "k"_a, "v"_a, "out"_a,
        "additive"_a.none(), "boolean"_a.none(), "causal"_a, "bottom_right"_a, "scale"_a.none(),
        "bf16"_a, "backend"_a.none(), "threads"_a, "executor"_a.none(), "window"_a = 0,
        "softcap"_a = 0.0f, "sinks"_a.none() = nb::none());
  m.def("_attention_bf16", &attention_call<bf16_heads_input, bf16_heads_output>, "q"_a, "k"_a,
        "v"_a, "out"_a, "additive"_a.none(), "boolean"_a.none(), "causal"_a, "bottom_right"_a,
        "scale"_a.none(), "bf16"_a, "backend"_a.none(), "threads"_a, "executor"_a.none(),
        "window"_a = 0, "softcap"_a = 0.0f, "sinks"_a.none() = nb::none());
  // mha.AttentionCache's cache and mha.attention's call over it (python/mha/_cache.py checks
  // the arguments first; the library names what it refuses).
  m.def(
      "_make_attention_cache",
      [](const std::optional<std::string>& backend, int_arg batch, int_arg capacity,
         int_arg kv_heads, int_arg head_dim, std::string_view kv, std::string_view precision,
         int_arg window) {
        constexpr std::string_view where = "mha.AttentionCache";
        const mha::backend& b = backend_named(backend);
        return mha::make_attention_cache(
            b, batch.get(where, "batch"), capacity.get(where, "capacity"),
            kv_heads.get(where, "kv_heads"), head_dim.get(where, "head_dim"),
            mha::parse_precision(kv), mha::parse_precision(precision), window.get(where, "window"));
      },
      "backend"_a.none(), "batch"_a, "capacity"_a, "kv_heads"_a, "head_dim"_a, "kv"_a,
      "precision"_a, "window"_a);
  m.def(
      "_attention_over_cache",
      [](const heads_input& q, const heads_input& k, const heads_input& v, mha::kv_cache& cache,
         const heads_output& out, bool causal, bool bottom_right, std::optional<float> scale,
         bool bf16, const std::optional<std::string>& backend, int threads,
         const std::optional<std::string>& executor, int_arg first_sequence, std::int64_t window,
         float softcap, const std::optional<sink_array>& sinks) {
        mha::attention_options o = call_options(causal, bottom_right, scale, bf16, threads,
                                                executor, {window, softcap, sinks});
        const std::int64_t first = first_sequence.get("mha.attention", "first_sequence");
        const mha::backend& b = backend_named(backend);
        const auto qv = heads_of(q, "query"), kv = heads_of(k, "key"), vv = heads_of(v, "value");
        const auto ov = heads_of(out, "out");
        nb::gil_scoped_release unlocked;
        mha::attention(b, qv, kv, vv, cache, ov, o, first);
      },
      "q"_a, "k"_a, "v"_a, "cache"_a, "out"_a, "causal"_a, "bottom_right"_a, "scale"_a.none(),
      "bf16"_a, "backend"_a.none(), "threads"_a, "executor"_a.none(), "first_sequence"_a,
      "window"_a = 0, "softcap"_a = 0.0f, "sinks"_a.none() = nb::none());
}
