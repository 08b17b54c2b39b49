#include <functional>

#include "core/checks.hpp"
#include "core/text.hpp"
#include "mha/backend.hpp"
#include "mha/error.hpp"

namespace mha {
namespace {

using detail::text;

std::string shape_of(const auto& view) {
  return text("(", view.batch(), ", ", view.seq_len(), ", ", view.features(), ")");
}

// True when [a, a + a_size) and [b, b + b_size) share a float.
bool overlap(const float* a, std::int64_t a_size, const float* b, std::int64_t b_size) {
  std::less<const float*> before;  // total order even for unrelated pointers
  return before(a, b + b_size) && before(b, a + a_size);
}

void check_run(std::string_view where, const config& cfg, tensor_view<const float> x,
               tensor_view<float> y, const run_options& options) {
  if (x.data() == nullptr) throw invalid_argument(text(where, ": input x has no data (nullptr)"));
  if (y.data() == nullptr) throw invalid_argument(text(where, ": output y has no data (nullptr)"));
  if (x.batch() < 1)
    throw invalid_argument(text(where, ": input batch (", x.batch(), ") must be >= 1"));
  if (x.seq_len() < 1) {
    throw invalid_argument(text(where, ": input seq_len (", x.seq_len(), ") must be >= 1"));
  }
  if (x.seq_len() > cfg.context_length) {
    throw invalid_argument(text(where, ": input seq_len (", x.seq_len(),
                                ") exceeds context_length (", cfg.context_length, ")"));
  }
  if (x.features() != cfg.d_in) {
    throw invalid_argument(text(where, ": input x is ", shape_of(x), ", its last dimension (",
                                x.features(), ") must equal d_in (", cfg.d_in, ")"));
  }
  if (y.batch() != x.batch() || y.seq_len() != x.seq_len() || y.features() != cfg.d_out) {
    throw invalid_argument(text(where, ": output y is ", shape_of(y), ", expected (", x.batch(),
                                ", ", x.seq_len(), ", ", cfg.d_out, ") for input ", shape_of(x)));
  }
  detail::check_byte_count(where, "input x", {x.batch(), x.seq_len(), x.features()}, sizeof(float));
  detail::check_byte_count(where, "output y", {y.batch(), y.seq_len(), y.features()},
                           sizeof(float));
  // Scores of one head, for backends that materialise them.
  detail::check_byte_count(where, "attention scores", {x.seq_len(), x.seq_len()}, sizeof(float));
  if (overlap(x.data(), x.size(), y.data(), y.size())) {
    throw invalid_argument(
        text(where, ": input x and output y overlap in memory; run() needs ", "separate buffers"));
  }
  if (options.threads < 0 || options.threads > max_run_threads) {
    throw invalid_argument(text(where, ": run_options.threads (", options.threads,
                                ") must be >= 0 (0 = all cores) and <= ", max_run_threads));
  }
}

}  // namespace

void plan::run(tensor_view<const float> x, tensor_view<float> y, const run_options& options) const {
  check_run(backend_name_, config_, x, y, options);
  execute(x, y, options);
}

std::unique_ptr<plan> backend::prepare(const config& cfg, formulation form,
                                       const weights& w) const {
  const std::string where(name());
  detail::check_config(cfg, where);
  if (form != formulation::wrapper && form != formulation::split_weight) {
    throw invalid_argument(text(where, ": unknown formulation value ", static_cast<int>(form)));
  }
  if (const support s = supports(problem{cfg, form}); !s) {
    throw unsupported(text(where, ": does not compute ", to_string(form), " with ", to_string(cfg),
                           ": ", s.reason()));
  }
  validate(cfg, w);
  return make_plan(cfg, form, w);
}

support backend::supports(const problem& p) const {
  if (p.cfg.precision != precision::fp32) {
    return support::no(text(to_string(p.cfg.precision), " precision is not implemented"));
  }
  if (p.cfg.kv_heads() != p.cfg.n_heads) {
    return support::no(text("grouped-query attention (n_kv_heads ", p.cfg.kv_heads(),
                            " < n_heads ", p.cfg.n_heads, ") is not implemented"));
  }
  if (p.past != 0) return support::no("decode with a KV cache (past > 0) is not implemented");
  return support::yes();
}

}  // namespace mha
