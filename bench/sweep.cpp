// The series algebra (overrides, the expansion into points and cases, the shapes as JSON, the
// filter); the presets are in presets.cpp, sharding and the budget in shards.cpp.
#include "sweep.hpp"

#include <algorithm>
#include <cstdio>
#include <regex>

#include "mha/error.hpp"

namespace mha_bench {
namespace {

template <class T>
void require_positive(std::span<const T> values, std::string_view series_name,
                      std::string_view what) {
  if (values.empty()) {
    throw mha::invalid_argument("mha_bench: series " + std::string(series_name) + " has no " +
                                std::string(what) + " values");
  }
  for (T v : values) {
    if (v < 1) {
      throw mha::invalid_argument("mha_bench: " + std::string(what) + " (" + std::to_string(v) +
                                  ") must be >= 1");
    }
  }
}

void add_once(std::vector<std::string>& to, const std::string& name) {
  if (std::find(to.begin(), to.end(), name) == to.end()) to.push_back(name);
}

// Why series `series` leaves out a KV cache in `cache` for plans in `plan` at `past` cached
// tokens, or nullopt when it keeps it: a forward pass keeps no cache, and a float cache is kept
// in its plan's precision (docs/design.md §1.7).
std::optional<std::string> cache_left_out(mha::precision cache, mha::precision plan,
                                          std::int64_t past, const std::string& series) {
  const std::string name(mha::to_string(cache));
  if (cache != plan && past == 0) {
    return "the " + name + " KV cache of forward passes (series " + series +
           "): a forward pass keeps no cache";
  }
  if (cache != plan && !mha::coded(cache)) {
    return "the " + name + " KV cache with " + std::string(mha::to_string(plan)) +
           " plans (series " + series + "): a float cache is kept in its plan's precision";
  }
  return std::nullopt;
}

}  // namespace

std::string join(std::span<const std::string> parts, std::string_view separator) {
  std::string joined;
  for (const std::string& p : parts) {
    if (!joined.empty()) joined += separator;
    joined += p;
  }
  return joined;
}

mha::problem sweep_problem(std::int64_t batch, std::int64_t seq_len, std::int64_t d_model,
                           std::int64_t heads, std::int64_t kv_heads, std::int64_t past,
                           mha::precision precision, std::optional<mha::precision> kv_precision,
                           std::int64_t window) {
  mha::problem p{.cfg = {.d_in = d_model,
                         .d_out = d_model,
                         .n_heads = heads,
                         .context_length = past + seq_len},
                 .form = mha::formulation::split_weight,
                 .batch = batch,
                 .seq_len = seq_len,
                 .past = past};
  p.cfg.n_kv_heads = kv_heads;
  p.cfg.precision = precision;
  p.cfg.window = window;
  if (kv_precision != precision) p.kv_precision = kv_precision;
  return p;
}

bool same_shape(const mha::problem& a, const mha::problem& b) noexcept {
  mha::problem a_as_b = a;
  a_as_b.form = b.form;
  return a_as_b == b;
}

std::string shape_name(const mha::problem& p) {
  const std::string name = mha::to_string(p);
  return name.substr(name.find('/') + 1);
}

std::string to_string(const series& s) {
  const auto list = [](const auto& values) {
    std::vector<std::string> text;
    for (auto v : values) text.push_back(std::to_string(v));
    return join(text, ",");
  };
  const std::string d_model = s.head_dim > 0 ? std::to_string(s.head_dim) + "*H" : list(s.d_model);
  std::string text = s.name + ": B=" + list(s.batch) + " T=" + list(s.seq_len) +
                     " d_model=" + d_model + " H=" + list(s.heads);
  if (!s.kv_groups.empty()) {
    text += " kv_groups=" + list(s.kv_groups);
  } else if (!s.kv_heads.empty()) {
    text += " kv_heads=" + list(s.kv_heads);
  }
  if (!s.past.empty()) text += " past=" + list(s.past);
  if (!s.precisions.empty()) {
    std::vector<std::string> names;
    for (mha::precision p : s.precisions) names.emplace_back(mha::to_string(p));
    text += " precision=" + join(names, ",");
  }
  if (!s.kv_precisions.empty()) {
    std::vector<std::string> names;
    for (mha::precision p : s.kv_precisions) names.emplace_back(mha::to_string(p));
    text += " kv_precision=" + join(names, ",");
  }
  if (!s.window.empty()) text += " window=" + list(s.window);
  return text + " threads=" + list(s.threads);
}

std::vector<series> apply(std::vector<series> list, const overrides& o) {
  for (series& s : list) {
    if (o.batch) s.batch = *o.batch;
    if (o.seq_len) s.seq_len = *o.seq_len;
    if (o.heads) s.heads = *o.heads;
    if (o.d_model && s.head_dim == 0) s.d_model = *o.d_model;
    if (o.threads) s.threads = *o.threads;
    if (o.kv_heads) {
      s.kv_heads = *o.kv_heads;
      s.kv_groups.clear();
    }
    if (o.past) s.past = *o.past;
    if (o.precisions) s.precisions = *o.precisions;
    if (o.kv_precisions) s.kv_precisions = *o.kv_precisions;
    if (o.window) s.window = *o.window;
  }
  return list;
}

std::string shapes_json(const expansion& e) {
  std::string out = "[";
  for (std::size_t i = 0; i < e.points.size();) {
    // expand() keeps a shape's points together: one object per run of equal shapes.
    const mha::problem& p = e.points[i].problem;
    std::vector<std::string> threads, names;
    for (; i < e.points.size() && e.points[i].problem == p; ++i) {
      threads.push_back(std::to_string(e.points[i].threads));
      for (const std::string& n : e.points[i].series) add_once(names, n);
    }
    const mha::config& c = p.cfg;
    std::string axes;
    if (c.n_kv_heads > 0) axes += ", \"n_kv_heads\": " + std::to_string(c.n_kv_heads);
    if (p.past > 0) axes += ", \"past\": " + std::to_string(p.past);
    if (c.precision != mha::precision::fp32)
      axes += ", \"precision\": \"" + std::string(mha::to_string(c.precision)) + "\"";
    if (p.kv_precision)
      axes += ", \"kv_precision\": \"" + std::string(mha::to_string(*p.kv_precision)) + "\"";
    if (c.window > 0) axes += ", \"window\": " + std::to_string(c.window);
    char flops[32];
    std::snprintf(flops, sizeof flops, "%.17g", mha::flops(p));
    out += std::string(out.size() > 1 ? ",\n " : "\n ") + "{\"batch\": " + std::to_string(p.batch) +
           ", \"seq_len\": " + std::to_string(p.seq_len) + ", \"d_in\": " + std::to_string(c.d_in) +
           ", \"d_out\": " + std::to_string(c.d_out) +
           ", \"n_heads\": " + std::to_string(c.n_heads) +
           ", \"causal\": " + (c.causal ? "true" : "false") +
           ", \"qkv_bias\": " + (c.qkv_bias ? "true" : "false") +
           ", \"out_proj\": " + (c.out_proj ? "true" : "false") + ", \"threads\": [" +
           join(threads, ", ") + "], \"series\": \"" + join(names, ",") + "\"" + axes +
           ", \"name\": \"" + shape_name(p) + "\", \"flops\": " + flops + "}";
  }
  return out + "\n]\n";
}

expansion covered_points(const expansion& e, std::span<const bench_case> cases) {
  expansion out{.points = {}, .dropped = e.dropped};
  for (const sweep_point& p : e.points) {
    const bool covered = std::ranges::any_of(cases, [&](const bench_case& c) {
      return same_shape(c.problem, p.problem) && c.threads == p.threads;
    });
    if (covered) out.points.push_back(p);
  }
  return out;
}

expansion expand(std::span<const series> list) {
  expansion out;
  // Shapes in first-seen order; each shape's points are gathered so they run together.
  std::vector<mha::problem> shapes;
  std::vector<std::vector<sweep_point>> points_of;
  for (const series& s : list) {
    require_positive<std::int64_t>(s.batch, s.name, "batch");
    require_positive<std::int64_t>(s.seq_len, s.name, "seq_len");
    require_positive<std::int64_t>(s.heads, s.name, "heads");
    require_positive<int>(s.threads, s.name, "threads");
    if (s.head_dim == 0) require_positive<std::int64_t>(s.d_model, s.name, "d_model");
    for (auto [values, what] :
         {std::pair{&s.kv_heads, "kv_heads"}, std::pair{&s.kv_groups, "kv_groups"},
          std::pair{&s.past, "past"}, std::pair{&s.window, "window"}}) {
      for (std::int64_t v : *values) {
        if (v < 0) {
          throw mha::invalid_argument("mha_bench: " + std::string(what) + " (" + std::to_string(v) +
                                      ") must be >= 0");
        }
      }
    }
    const auto or_default = [](const auto& values, auto fallback) {
      return values.empty() ? std::vector{fallback} : values;
    };
    const std::vector<std::int64_t> past_list = or_default(s.past, std::int64_t{0});
    const std::vector<std::int64_t> window_list = or_default(s.window, std::int64_t{0});
    const std::vector<mha::precision> precision_list =
        or_default(s.precisions, mha::precision::fp32);
    // The K/V heads of H: from kv_groups when set (-g: g does not divide H), else kv_heads.
    const auto kv_list_for = [&](std::int64_t h) {
      if (s.kv_groups.empty()) return or_default(s.kv_heads, std::int64_t{0});
      std::vector<std::int64_t> kv;
      for (std::int64_t g : s.kv_groups) {
        kv.push_back(g == 0 ? 1 : h % g == 0 ? h / g : -g);
      }
      return kv;
    };
    // The shape at each of the series' thread counts, naming the series; a shape met before
    // (in this series or another) gains the thread counts and the name.
    const auto add_point = [&](const mha::problem& shape) {
      auto it = std::find(shapes.begin(), shapes.end(), shape);
      if (it == shapes.end()) {
        shapes.push_back(shape);
        points_of.emplace_back();
        it = shapes.end() - 1;
      }
      std::vector<sweep_point>& pts = points_of[static_cast<std::size_t>(it - shapes.begin())];
      for (int n : s.threads) {
        auto p = std::find_if(pts.begin(), pts.end(),
                              [&](const sweep_point& q) { return q.threads == n; });
        if (p == pts.end()) p = pts.insert(pts.end(), sweep_point{shape, n, {}});
        add_once(p->series, s.name);
      }
    };
    for (std::int64_t h : s.heads) {
      const std::vector<std::int64_t> widths =
          s.head_dim > 0 ? std::vector<std::int64_t>{s.head_dim * h} : s.d_model;
      for (std::int64_t d : widths) {
        for (std::int64_t b : s.batch) {
          for (std::int64_t t : s.seq_len) {
            if (d % h != 0) {
              out.dropped.push_back("d_model " + std::to_string(d) + " is not divisible by " +
                                    std::to_string(h) + " heads (B=" + std::to_string(b) +
                                    " T=" + std::to_string(t) + ", series " + s.name + ")");
              continue;
            }
            for (std::int64_t kv_given : kv_list_for(h)) {
              const std::string where = " (B=" + std::to_string(b) + " T=" + std::to_string(t) +
                                        " d_model=" + std::to_string(d) + ", series " + s.name +
                                        ")";
              if (kv_given < 0) {
                out.dropped.push_back(std::to_string(h) + " heads do not form groups of " +
                                      std::to_string(-kv_given) + where);
                continue;
              }
              if (kv_given > 0 && h % kv_given != 0) {
                out.dropped.push_back(std::to_string(h) + " heads are not divisible by " +
                                      std::to_string(kv_given) + " K/V heads" + where);
                continue;
              }
              // H K/V heads is multi-head attention: one shape, one name, however it was asked.
              const std::int64_t kv = kv_given == h ? 0 : kv_given;
              for (std::int64_t past : past_list) {
                for (mha::precision precision : precision_list) {
                  for (mha::precision cache : or_default(s.kv_precisions, precision)) {
                    if (auto why = cache_left_out(cache, precision, past, s.name)) {
                      add_once(out.dropped, *why);
                      continue;
                    }
                    for (std::int64_t w : window_list) {
                      if (w > 0 && w >= past + t) {
                        add_once(out.dropped, "window " + std::to_string(w) + " over " +
                                                  std::to_string(past + t) +
                                                  " positions: it covers every key, the causal "
                                                  "attention of window 0" +
                                                  where);
                        continue;
                      }
                      add_point(sweep_problem(b, t, d, h, kv, past, precision, cache, w));
                    }
                  }
                }
              }
            }
          }
        }
      }
    }
  }
  if (shapes.empty()) {
    throw mha::invalid_argument(
        "mha_bench: no shape left to measure" +
        (out.dropped.empty() ? std::string() : "; dropped: " + join(out.dropped, "; ")));
  }
  for (auto& pts : points_of) {
    std::sort(pts.begin(), pts.end(),
              [](const sweep_point& a, const sweep_point& b) { return a.threads < b.threads; });
    for (sweep_point& p : pts) out.points.push_back(std::move(p));
  }
  return out;
}

std::string bench_case::name() const {
  return "mha/" + backend_name + "/" + mha::to_string(problem) +
         "/threads:" + std::to_string(threads);
}

std::string bench_case::label() const { return "series=" + join(series, ","); }

std::vector<bench_case> make_cases(std::span<const sweep_point> points,
                                   std::span<const backend_info> backends,
                                   std::span<const mha::formulation> formulations) {
  std::vector<bench_case> cases;
  for (std::size_t first = 0; first < points.size();) {
    // points[first, last) share one shape (expand() keeps them together).
    std::size_t last = first;
    while (last < points.size() && points[last].problem == points[first].problem) ++last;
    for (std::size_t b = 0; b < backends.size(); ++b) {
      for (mha::formulation form : formulations) {
        const std::size_t shape_start = cases.size();
        for (std::size_t p = first; p < last; ++p) {
          const int n = std::clamp(points[p].threads, 1, std::max(1, backends[b].max_threads));
          auto it = std::find_if(cases.begin() + static_cast<std::ptrdiff_t>(shape_start),
                                 cases.end(), [&](const bench_case& c) { return c.threads == n; });
          if (it == cases.end()) {
            mha::problem in_form = points[p].problem;
            in_form.form = form;
            it = cases.insert(cases.end(), bench_case{b, backends[b].name, in_form, n, {}});
          }
          for (const std::string& s : points[p].series) add_once(it->series, s);
        }
      }
    }
    first = last;
  }
  return cases;
}

bool filter_selects(std::string_view filter, std::string_view name) {
  // The steps of benchmark::FindBenchmarks in 1.7.1, in its order.
  std::string spec(filter);
  if (spec.empty() || spec == "all") spec = ".";
  bool negative = false;
  if (spec.front() == '-') {
    negative = true;
    spec.erase(0, 1);
  }
  try {
    const std::regex re(spec, std::regex::extended);
    return std::regex_search(name.begin(), name.end(), re) != negative;
  } catch (const std::regex_error& e) {
    throw mha::invalid_argument("mha_bench: --benchmark_filter '" + std::string(filter) +
                                "' is not a valid regular expression: " + e.what());
  }
}

}  // namespace mha_bench
