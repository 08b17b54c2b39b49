// mha._mha: the C++ interface as the `mha` Python package (python/mha) sees it. Thin on
// purpose: every check and every message is the library's own; the package adds what is
// Python's (tensors of either framework, modules, bf16 tensors) on top.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/operators.h>
#include <nanobind/stl/filesystem.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/string_view.h>
#include <nanobind/stl/unique_ptr.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "base/feature_probes.hpp"
#include "bindings.hpp"
#include "io/model_config.hpp"
#include "mha/mha.hpp"

namespace nb = nanobind;
using namespace nb::literals;
using mha_python::backend_named;
using mha_python::executor_named;
using mha_python::int_arg;

namespace {

// x: (batch, tokens, d_in) float32 in C order in CPU memory, read where it lies. An array or
// tensor of other strides is copied into that layout by nanobind first (the package checks
// the dtype and the rank before, so that is the only conversion).
using input_array = nb::ndarray<const float, nb::ndim<3>, nb::c_contig, nb::device::cpu>;
// y: written where it lies; the package passes only arrays of exactly this kind (never
// converted: a copy would be written and thrown away).
using output_array = nb::ndarray<float, nb::ndim<3>, nb::c_contig, nb::device::cpu>;
// One tensor of a state_dict, any rank (the package hands float32 in C order).
using weight_array = nb::ndarray<const float, nb::c_contig, nb::device::cpu>;

mha::tensor_view<const float> view(const input_array& x) {
  return {x.data(), static_cast<std::int64_t>(x.shape(0)), static_cast<std::int64_t>(x.shape(1)),
          static_cast<std::int64_t>(x.shape(2))};
}

mha::tensor_view<float> view(const output_array& y) {
  return {y.data(), static_cast<std::int64_t>(y.shape(0)), static_cast<std::int64_t>(y.shape(1)),
          static_cast<std::int64_t>(y.shape(2))};
}

}  // namespace

const mha::backend& mha_python::backend_named(const std::optional<std::string>& name) {
  return name ? mha::require_backend(*name) : mha::default_backend();
}

const mha::executor* mha_python::executor_named(const std::optional<std::string>& name) {
  if (!name || *name == "tbb") return nullptr;
#if MHA_WITH_TBB
  if (*name == "serial") return &mha::serial_executor();
  if (*name == "openmp") {
    if (const mha::executor* e = mha::openmp_executor()) return e;
    throw mha::unsupported(
        "mha: executor \"openmp\": this build of mha has no OpenMP (CMake found "
        "none for the tbb backend); expected \"tbb\" or \"serial\"");
  }
#endif
  throw mha::invalid_argument("mha: executor \"" + *name +
                              "\" is not one of tbb, openmp, serial (the tbb backend's)");
}

namespace {

mha::run_options options_of(int threads, const std::optional<std::string>& executor) {
  mha::run_options o;
  o.threads = threads;
  o.executor = executor_named(executor);
  return o;
}

// A module read from a state_dict or a model folder, its config still editable (causal,
// precision, dropout, context length: what a state_dict does not record) before prepare().
struct loaded_module {
  mha::io::loaded_module module;

  std::unique_ptr<mha::plan> prepare(const std::optional<std::string>& backend,
                                     std::string_view formulation) const {
    const mha::backend& b = backend_named(backend);
    return b.prepare(module.cfg, mha::parse_formulation(formulation), module.w);
  }
};

mha::io::state_dict_options state_dict_options(std::int64_t n_heads, std::int64_t n_kv_heads,
                                               std::optional<double> rope_base,
                                               std::int64_t context_length, std::string prefix) {
  mha::io::state_dict_options o;
  o.n_heads = n_heads;
  o.n_kv_heads = n_kv_heads;
  o.rope_base = rope_base;
  o.context_length = context_length;
  o.prefix = std::move(prefix);
  return o;
}

loaded_module from_state_dict(const std::map<std::string, weight_array>& tensors,
                              const std::map<std::string, std::string>& metadata,
                              const mha::io::state_dict_options& options) {
  mha::io::tensor_file file;
  for (const auto& [name, array] : tensors) {
    mha::io::tensor t;
    for (std::size_t i = 0; i < array.ndim(); ++i)
      t.shape.push_back(static_cast<std::int64_t>(array.shape(i)));
    t.values.assign(array.data(), array.data() + array.size());
    file.tensors.emplace(name, std::move(t));
  }
  file.metadata.insert(metadata.begin(), metadata.end());
  return {mha::io::module_from_state_dict(std::move(file), options)};
}

// What a backend declines of the features `mha backends` asks about: feature -> {formulation:
// reason}, empty where it computes the feature in every formulation.
std::map<std::string, std::map<std::string, std::string>> declines(const mha::backend& b) {
  std::map<std::string, std::map<std::string, std::string>> out;
  for (const auto& [feature, reasons] : mha::detail::declines(b)) {
    auto& named = out[feature];
    for (const auto& [form, reason] : reasons) named[std::string(mha::to_string(form))] = reason;
  }
  return out;
}

}  // namespace

NB_MODULE(_mha, m) {
  m.doc() = "mha's C++ library (the mha package wraps it: use `import mha`)";

  // mha::error and its kinds as Python exceptions with the library's messages; InvalidArgument
  // is a ValueError too.
  static nb::handle error, invalid, unsupported, format;
  error = PyErr_NewException("mha.Error", PyExc_RuntimeError, nullptr);
  invalid = PyErr_NewException("mha.InvalidArgument",
                               nb::make_tuple(error, nb::handle(PyExc_ValueError)).ptr(), nullptr);
  unsupported = PyErr_NewException("mha.Unsupported", error.ptr(), nullptr);
  format = PyErr_NewException("mha.FormatError", error.ptr(), nullptr);
  m.attr("Error") = error;
  m.attr("InvalidArgument") = invalid;
  m.attr("Unsupported") = unsupported;
  m.attr("FormatError") = format;
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const mha::invalid_argument& e) {
      PyErr_SetString(invalid.ptr(), e.what());
    } catch (const mha::unsupported& e) {
      PyErr_SetString(unsupported.ptr(), e.what());
    } catch (const mha::format_error& e) {
      PyErr_SetString(format.ptr(), e.what());
    } catch (const mha::error& e) {
      PyErr_SetString(error.ptr(), e.what());
    }
  });

  nb::class_<mha::rope_scaling>(m, "RopeScaling")
      .def(
          "__init__",
          [](mha::rope_scaling* s, std::string_view kind, double factor, double low_freq_factor,
             double high_freq_factor, int_arg original_context, double beta_fast, double beta_slow,
             bool truncate, double attention_factor) {
            mha::rope_scaling::type t = mha::rope_scaling::type::none;
            if (kind == "linear") {
              t = mha::rope_scaling::type::linear;
            } else if (kind == "llama3") {
              t = mha::rope_scaling::type::llama3;
            } else if (kind == "yarn") {
              t = mha::rope_scaling::type::yarn;
            } else if (kind != "none") {
              throw mha::invalid_argument("mha: rope scaling kind \"" + std::string(kind) +
                                          "\" is not one of none, linear, llama3, yarn");
            }
            new (s) mha::rope_scaling{t,
                                      factor,
                                      low_freq_factor,
                                      high_freq_factor,
                                      original_context.get("mha.RopeScaling", "original_context"),
                                      beta_fast,
                                      beta_slow,
                                      truncate,
                                      attention_factor};
          },
          "kind"_a = "none", "factor"_a = 1.0, "low_freq_factor"_a = 1.0,
          "high_freq_factor"_a = 4.0, "original_context"_a = nb::int_(0), "beta_fast"_a = 32.0,
          "beta_slow"_a = 1.0, "truncate"_a = true, "attention_factor"_a = 0.0)
      // The scaling a problem name spells (mha::parse_rope_scaling; "" for none).
      .def_static(
          "from_name",
          [](std::string_view name) {
            if (name.empty()) return mha::rope_scaling{};
            if (const auto s = mha::parse_rope_scaling(name)) return *s;
            throw mha::invalid_argument("mha: rope scaling \"" + std::string(name) +
                                        "\" is not linear<factor>, "
                                        "llama3_<factor>_<low>_<high>_<original_context> or "
                                        "yarn_<factor>_<beta_fast>_<beta_slow>_<original_context>_"
                                        "<attention_factor>_<truncate 0|1>");
          },
          "name"_a)
      .def_prop_ro("kind",
                   [](const mha::rope_scaling& s) { return std::string(mha::to_string(s.kind)); })
      .def_ro("factor", &mha::rope_scaling::factor)
      .def_ro("low_freq_factor", &mha::rope_scaling::low_freq_factor)
      .def_ro("high_freq_factor", &mha::rope_scaling::high_freq_factor)
      .def_ro("original_context", &mha::rope_scaling::original_context)
      .def_ro("beta_fast", &mha::rope_scaling::beta_fast)
      .def_ro("beta_slow", &mha::rope_scaling::beta_slow)
      .def_ro("truncate", &mha::rope_scaling::truncate)
      .def_ro("attention_factor", &mha::rope_scaling::attention_factor)
      .def(nb::self == nb::self)
      .def("__repr__", [](const mha::rope_scaling& s) {
        const std::string name = mha::rope_scaling_name(s);
        return "mha.RopeScaling(" + (name.empty() ? std::string("none") : name) + ")";
      });

  nb::class_<mha::config>(m, "Config")
      .def(
          "__init__",
          [](mha::config* c, int_arg d_in, int_arg d_out, int_arg n_heads, int_arg context_length,
             bool causal, bool qkv_bias, bool out_proj, bool out_proj_bias, float dropout,
             int_arg n_kv_heads, std::string_view precision, double rope_base,
             const mha::rope_scaling& scaling, int_arg window, double softcap, bool sinks,
             int_arg out_features, bool qk_norm, double qk_norm_eps) {
            constexpr std::string_view where = "mha.Config";
            mha::config cfg;
            cfg.d_in = d_in.get(where, "d_in");
            cfg.d_out = d_out.get(where, "d_out");
            cfg.n_heads = n_heads.get(where, "n_heads");
            cfg.context_length = context_length.get(where, "context_length");
            cfg.causal = causal;
            cfg.qkv_bias = qkv_bias;
            cfg.out_proj = out_proj;
            cfg.out_proj_bias = out_proj && out_proj_bias;
            cfg.dropout = dropout;
            cfg.n_kv_heads = n_kv_heads.get(where, "n_kv_heads");
            cfg.precision = mha::parse_precision(precision);
            cfg.rope_base = rope_base;
            cfg.rope_scaling = scaling;
            cfg.window = window.get(where, "window");
            cfg.softcap = softcap;
            cfg.sinks = sinks;
            cfg.out_features = out_features.get(where, "out_features");
            cfg.qk_norm = qk_norm;
            cfg.qk_norm_eps = qk_norm_eps;
            mha::validate(cfg);
            new (c) mha::config(cfg);
          },
          "d_in"_a, "d_out"_a, "n_heads"_a, "context_length"_a, nb::kw_only(), "causal"_a = true,
          "qkv_bias"_a = false, "out_proj"_a = true, "out_proj_bias"_a = true, "dropout"_a = 0.0f,
          "n_kv_heads"_a = nb::int_(0), "precision"_a = "fp32", "rope_base"_a = 0.0,
          "rope_scaling"_a = mha::rope_scaling{}, "window"_a = nb::int_(0), "softcap"_a = 0.0,
          "sinks"_a = false, "out_features"_a = nb::int_(0), "qk_norm"_a = false,
          "qk_norm_eps"_a = 1e-6)
      .def_ro("d_in", &mha::config::d_in)
      .def_ro("d_out", &mha::config::d_out)
      .def_ro("n_heads", &mha::config::n_heads)
      .def_ro("context_length", &mha::config::context_length)
      .def_ro("causal", &mha::config::causal)
      .def_ro("qkv_bias", &mha::config::qkv_bias)
      .def_ro("out_proj", &mha::config::out_proj)
      .def_ro("out_proj_bias", &mha::config::out_proj_bias)
      .def_ro("dropout", &mha::config::dropout)
      .def_prop_ro("n_kv_heads", &mha::config::kv_heads)
      .def_prop_ro("head_dim", &mha::config::head_dim)
      .def_prop_ro("precision",
                   [](const mha::config& c) { return std::string(mha::to_string(c.precision)); })
      .def_ro("rope_base", &mha::config::rope_base)
      .def_ro("rope_scaling", &mha::config::rope_scaling)
      .def_ro("window", &mha::config::window)
      .def_ro("softcap", &mha::config::softcap)
      .def_ro("sinks", &mha::config::sinks)
      .def_ro("out_features", &mha::config::out_features)
      .def_prop_ro("out_width", &mha::config::out_width)
      .def_ro("qk_norm", &mha::config::qk_norm)
      .def_ro("qk_norm_eps", &mha::config::qk_norm_eps)
      .def(nb::self == nb::self)
      .def("__repr__",
           [](const mha::config& c) { return "mha.Config(" + mha::to_string(c) + ")"; });

  nb::class_<mha::backend>(m, "Backend")
      .def_prop_ro("name", [](const mha::backend& b) { return std::string(b.name()); })
      .def_prop_ro("description", &mha::backend::description)
      .def_prop_ro("isa",
                   [](const mha::backend& b) { return std::string(mha::to_string(b.isa())); })
      .def_prop_ro("max_threads", &mha::backend::max_threads)
      .def(
          "supports",
          [](const mha::backend& b, const mha::config& cfg, std::string_view formulation,
             int_arg past, std::optional<std::string_view> kv) -> std::optional<std::string> {
            mha::problem p;
            p.cfg = cfg;
            p.form = mha::parse_formulation(formulation);
            p.past = past.get("mha.Backend.supports", "past");
            if (kv) p.kv_precision = mha::parse_precision(*kv);
            const mha::support s = b.supports(p);
            return s ? std::nullopt : std::optional<std::string>(s.reason());
          },
          "config"_a, "formulation"_a = "split_weight", "past"_a = nb::int_(0),
          "kv_precision"_a = nb::none())
      .def("declines", &declines)
      .def(
          "supports_attention",
          [](const mha::backend& b, std::string_view precision) -> std::optional<std::string> {
            const mha::support s = b.supports_attention(mha::parse_precision(precision));
            return s ? std::nullopt : std::optional<std::string>(s.reason());
          },
          "precision"_a = "fp32")
      .def("__repr__",
           [](const mha::backend& b) { return "mha.Backend(" + std::string(b.name()) + ")"; });

  m.def(
      "backends",
      [] {
        const auto& all = mha::available_backends();
        return std::vector<const mha::backend*>(all.begin(), all.end());
      },
      nb::rv_policy::reference);
  m.def(
      "default_backend", [] { return &mha::default_backend(); }, nb::rv_policy::reference);

  nb::class_<mha::kv_cache>(m, "Cache")
      .def_prop_ro("batch", &mha::kv_cache::batch)
      .def_prop_ro("capacity", &mha::kv_cache::capacity)
      .def_prop_ro("window", &mha::kv_cache::window)
      .def_prop_ro("slots", &mha::kv_cache::slots)
      .def_prop_ro("lengths", &mha::kv_cache::lengths)
      .def_prop_ro(
          "precision",
          [](const mha::kv_cache& c) { return std::string(mha::to_string(c.precision())); })
      .def_prop_ro("nbytes", &mha::kv_cache::bytes)
      .def(
          "reset",
          [](mha::kv_cache& c, std::optional<int_arg> b) {
            if (b) {
              c.reset(b->get("mha.Cache.reset", "b"));
            } else {
              c.reset();
            }
          },
          "b"_a = nb::none())
      .def(
          "truncate",
          [](mha::kv_cache& c, int_arg b, int_arg length) {
            c.truncate(b.get("mha.Cache.truncate", "b"),
                       length.get("mha.Cache.truncate", "length"));
          },
          "b"_a, "length"_a)
      // copy.copy and copy.deepcopy: a new cache holding the same tokens (a prompt's cache
      // reused by several continuations); no cache shares another's storage.
      .def("__copy__", &mha::kv_cache::copy)
      .def(
          "__deepcopy__", [](const mha::kv_cache& c, nb::handle) { return c.copy(); }, "memo"_a)
      // pickle: refused by name (its bytes are the layout of this process's kernels and ISA).
      .def("__reduce_ex__",
           [](const mha::kv_cache&, nb::handle) -> nb::object {
             throw nb::type_error(
                 "mha.Cache cannot be pickled: it holds its tokens in the layout of this "
                 "process's kernels (backend and ISA); copy.deepcopy(cache) copies it");
           })
      .def("__repr__", [](const mha::kv_cache& c) {
        std::string lengths;
        for (std::int64_t n : c.lengths())
          lengths += (lengths.empty() ? "" : ", ") + std::to_string(n);
        return "mha.Cache(batch=" + std::to_string(c.batch()) +
               ", capacity=" + std::to_string(c.capacity()) +
               ", precision=" + std::string(mha::to_string(c.precision())) + ", lengths=[" +
               lengths + "])";
      });

  nb::class_<mha::plan>(m, "_Plan")
      .def_prop_ro("config", &mha::plan::config)
      .def_prop_ro("formulation",
                   [](const mha::plan& p) { return std::string(mha::to_string(p.formulation())); })
      .def_prop_ro("backend", [](const mha::plan& p) { return std::string(p.backend_name()); })
      .def(
          "run",
          [](const mha::plan& p, input_array x, output_array y, int threads,
             const std::optional<std::string>& executor) {
            const mha::run_options options = options_of(threads, executor);
            nb::gil_scoped_release unlocked;
            p.run(view(x), view(y), options);
          },
          "x"_a, "y"_a.noconvert(), "threads"_a, "executor"_a.none())
      .def(
          "run_cache",
          [](const mha::plan& p, input_array x, output_array y, mha::kv_cache& cache, int threads,
             const std::optional<std::string>& executor) {
            const mha::run_options options = options_of(threads, executor);
            nb::gil_scoped_release unlocked;
            p.run(view(x), view(y), cache, options);
          },
          "x"_a, "y"_a.noconvert(), "cache"_a, "threads"_a, "executor"_a.none())
      // The cache keeps its plan alive (it belongs to it).
      .def(
          "make_cache",
          [](const mha::plan& p, std::int64_t batch, std::int64_t capacity,
             std::optional<std::string_view> kv) {
            return p.make_cache(batch, capacity,
                                kv ? std::optional(mha::parse_precision(*kv)) : std::nullopt);
          },
          "batch"_a, "capacity"_a, "precision"_a = nb::none(), nb::keep_alive<0, 1>());

  nb::class_<loaded_module>(m, "_Module")
      .def_prop_rw(
          "config", [](const loaded_module& l) { return l.module.cfg; },
          [](loaded_module& l, const mha::config& cfg) { l.module.cfg = cfg; })
      .def_prop_ro(
          "layout",
          [](const loaded_module& l) { return std::string(mha::io::to_string(l.module.layout)); })
      .def_prop_ro("prefix", [](const loaded_module& l) { return l.module.prefix; })
      .def_prop_ro("context_source", [](const loaded_module& l) { return l.module.context_source; })
      .def("prepare", &loaded_module::prepare, "backend"_a = nb::none(),
           "formulation"_a = "split_weight");

  m.def(
      "_from_state_dict",
      [](const std::map<std::string, weight_array>& tensors,
         const std::map<std::string, std::string>& metadata, std::int64_t n_heads,
         std::int64_t n_kv_heads, std::optional<double> rope_base, std::int64_t context_length,
         std::string prefix) {
        return from_state_dict(
            tensors, metadata,
            state_dict_options(n_heads, n_kv_heads, rope_base, context_length, std::move(prefix)));
      },
      "tensors"_a, "metadata"_a, "n_heads"_a, "n_kv_heads"_a, "rope_base"_a.none(),
      "context_length"_a, "prefix"_a);
  m.def(
      "_from_pretrained",
      [](const std::filesystem::path& dir, std::int64_t layer, std::int64_t context_length) {
        mha::io::state_dict_options o;
        o.context_length = context_length;
        return loaded_module{mha::io::load_model(dir, layer, o)};
      },
      "dir"_a, "layer"_a, "context_length"_a);
  m.def(
      "_from_safetensors",
      [](const std::filesystem::path& path, std::int64_t n_heads, std::int64_t n_kv_heads,
         std::optional<double> rope_base, std::int64_t context_length, std::string prefix) {
        return loaded_module{mha::io::load_module(
            path,
            state_dict_options(n_heads, n_kv_heads, rope_base, context_length, std::move(prefix)))};
      },
      "path"_a, "n_heads"_a, "n_kv_heads"_a, "rope_base"_a.none(), "context_length"_a, "prefix"_a);

  // A Hugging Face config's text as mha reads config.json (mha::io::parse_model_config), for a
  // live module's config: its layer's block and the context length a caller asking for
  // `context_length` tokens (0: the model's) gets, with where that comes from.
  m.def(
      "_model_config",
      [](std::string_view text, std::string_view source, std::int64_t layer,
         std::int64_t context_length) {
        const mha::io::model_config c = mha::io::parse_model_config(text, source, layer);
        const mha::io::detail::block_context context =
            mha::io::detail::context_of(c, layer, context_length, "context_length", source);
        nb::dict out;
        out["model_type"] = c.model_type;
        out["layout"] = std::string(mha::io::to_string(c.layout));
        mha::config cfg = c.cfg;
        cfg.context_length = context.length;
        out["config"] = cfg;
        out["context_source"] = context.source;
        out["qk_norm_offset"] = c.qk_norm_offset;
        return out;
      },
      "text"_a, "source"_a, "layer"_a, "context_length"_a);

  // The most worker threads a call takes (run_options::threads, attention_options::threads).
  m.attr("max_run_threads") = mha::max_run_threads;
  // Whether the executor "openmp" exists in this build (the tbb backend's, with OpenMP).
#if MHA_WITH_TBB
  m.attr("openmp_executor") = mha::openmp_executor() != nullptr;
#else
  m.attr("openmp_executor") = false;
#endif

  m.def("rope_frequencies", &mha::rope_frequencies, "config"_a,
        "The rotary embedding's inverse frequencies of a config, one per pair of dimensions.");
  m.def("rope_amplitude", &mha::rope_amplitude, "config"_a,
        "The factor a config's rotary embedding scales cos and sin by (yarn's attention factor, "
        "else 1).");

  mha_python::bind_attention(m);
  // The address of the data an input array is read from (the package's tests compare it with
  // the tensor's own: no copy for contiguous float32).
  m.def("_input_address", [](input_array x) { return reinterpret_cast<std::uintptr_t>(x.data()); });
}
