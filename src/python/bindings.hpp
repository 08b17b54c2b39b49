// What the files of mha._mha share: module.cpp binds the module, its plans, caches and model
// folders; attention_bindings.cpp mha.attention's calls (bind_attention).
#pragma once

#include <nanobind/nanobind.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "mha/mha.hpp"

namespace mha_python {

namespace nb = nanobind;

// An integer argument of a public binding, taken as whatever Python passes and converted by
// get(): an int, or an integer of another kind (operator.index: NumPy's), within int64; anything
// else is mha.InvalidArgument naming the argument, where nanobind's own conversion would raise
// a TypeError listing the signatures. The stub names it int.
struct int_arg {
  nb::handle object;

  std::int64_t get(std::string_view where, std::string_view name) const {
    const auto refuse = [&](std::string_view expected) {
      return mha::invalid_argument(std::string(where) + ": " + std::string(name) + " (" +
                                   nb::repr(object).c_str() + ") " + std::string(expected));
    };
    if (PyBool_Check(object.ptr())) throw refuse("must be an integer, not a bool");
    PyObject* index = PyNumber_Index(object.ptr());
    if (index == nullptr) {
      PyErr_Clear();
      throw refuse("must be an integer");
    }
    int overflow = 0;
    const long long v = PyLong_AsLongLongAndOverflow(index, &overflow);
    Py_DECREF(index);
    if (overflow != 0) throw refuse("is outside the 64-bit integer range [-2^63, 2^63)");
    return v;
  }
};

// The executor a call names (mha/executor.hpp): "tbb" (or None), the tbb backend's own arena;
// "openmp", the process's OpenMP runtime (inside PyTorch, its workers); "serial". The package
// picks one per call (python/mha/_executor.py).
const mha::executor* executor_named(const std::optional<std::string>& name);

// The backend a call names (one of mha.backends()), or the default backend for None.
const mha::backend& backend_named(const std::optional<std::string>& name);

// Defines mha.attention's calls in m: _attention, _attention_bf16, _make_attention_cache and
// _attention_over_cache.
void bind_attention(nb::module_& m);

}  // namespace mha_python

namespace nanobind::detail {
template <>
struct type_caster<mha_python::int_arg> {
  NB_TYPE_CASTER(mha_python::int_arg, const_name("int"))
  bool from_python(handle src, uint8_t, cleanup_list*) noexcept {
    value.object = src;
    return true;
  }
  static handle from_cpp(const mha_python::int_arg& v, rv_policy, cleanup_list*) noexcept {
    return v.object.inc_ref();
  }
};
}  // namespace nanobind::detail
