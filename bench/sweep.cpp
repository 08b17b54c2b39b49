#include "sweep.hpp"

#include <algorithm>
#include <array>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <regex>

#include "mha/error.hpp"
#include "progress.hpp"

namespace mha_bench {
namespace {

// GPT-2 small: the anchor shape of docs/design.md §5 and of the backend targets.
constexpr std::int64_t gpt2_d_model = 768, gpt2_heads = 12, gpt2_context = 1024;

constexpr std::array<std::string_view, 7> names = {"quick",  "heads", "seq", "threads",
                                                   "decode", "cores", "full"};

std::vector<int> one_and_all(int hardware_threads) {
  if (hardware_threads == 1) return {1};
  return {1, hardware_threads};
}

std::vector<int> one_to_all(int hardware_threads) {
  std::vector<int> t;
  for (int n = 1; n <= hardware_threads; ++n) t.push_back(n);
  return t;
}

// H in the heads preset: divisors of 768 from 1 to 96, so both series have whole head_dims
// (down to 8 at d_model 768; up to d_model 6144 at head_dim 64).
const std::vector<std::int64_t> heads_axis = {1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96};

std::vector<series> quick(int hw) {
  // A first look in about a minute: split vs wrapper at five head counts of a GPT-2-wide
  // module (head_dim 768 down to 8, short sequence so the naive backend fits its budget), and
  // GPT-2 small at its full context, where backends differ most.
  return {{"quick_heads", {1}, {128}, {1, 4, 12, 48, 96}, {gpt2_d_model}, 0, one_and_all(hw)},
          {"gpt2_small", {1}, {gpt2_context}, {gpt2_heads}, {gpt2_d_model}, 0, one_and_all(hw)}};
}

std::vector<series> heads(int hw) {
  // Grouped-query attention at the fixed width: multi-head, groups of 4 and 8, multi-query, at
  // the H of the axis that 8 divides.
  series grouped{"heads_kv",     {4}, {256},          {8, 16, 24, 32, 48, 64, 96},
                 {gpt2_d_model}, 0,   one_and_all(hw)};
  grouped.kv_groups = {1, 4, 8, 0};
  return {{"heads_d_model", {4}, {256}, heads_axis, {gpt2_d_model}, 0, one_and_all(hw)},
          {"heads_head_dim", {1}, {128}, heads_axis, {}, 64, one_and_all(hw)},
          grouped};
}

std::vector<series> seq(int hw) {
  return {{"seq",
           {1},
           {64, 128, 256, 512, 1024, 2048, 4096},
           {gpt2_heads},
           {gpt2_d_model},
           0,
           one_and_all(hw)}};
}

std::vector<series> threads(int hw) {
  return {{"threads", {1}, {gpt2_context}, {gpt2_heads}, {gpt2_d_model}, 0, one_to_all(hw)}};
}

std::vector<series> decode(int hw) {
  // Generation: one new token per sequence over a cache of `past` tokens, GPT-2 small's width,
  // from a short prompt to a long context, for one sequence and for continuous batches.
  series s{"decode", {1, 8, 32}, {1}, {gpt2_heads}, {gpt2_d_model}, 0, one_and_all(hw)};
  s.past = {128, 512, 2048, 8192, 32768};
  // The same step with 3 K/V heads (groups of 4, 4x fewer cache bytes) and 1 (multi-query).
  series grouped{"decode_kv", {1, 8}, {1}, {gpt2_heads}, {gpt2_d_model}, 0, one_and_all(hw)};
  grouped.kv_heads = {3, 1};
  grouped.past = {2048, 8192, 32768};
  // The KV cache's precisions (docs/design.md §1.7): fp32 and bf16 plans, each with its own
  // cache and with an int8 one, for one sequence over a long context and a batch over a
  // middle one (the fp32 points are the decode series').
  series cache{"decode_cache", {1, 32}, {1}, {gpt2_heads}, {gpt2_d_model}, 0, one_and_all(hw)};
  cache.past = {2048, 8192};
  cache.precisions = {mha::precision::fp32, mha::precision::bf16};
  cache.kv_precisions = {mha::precision::fp32, mha::precision::bf16, mha::precision::int8};
  // Long contexts: one sequence over 32k and 128k cached tokens in each cache precision (the
  // fp32 cache of 128k tokens is 805 MB: it fits where mha runs).
  series long_context = cache;
  long_context.name = "decode_long";
  long_context.batch = {1};
  long_context.past = {32768, 131072};
  // A Llama-3-8B-like step (d_model 4096, 32 query heads of 128 dimensions over 8 K/V heads):
  // the 4 query heads of a K/V head read its cache together (on AMX, a tile's rows), fp32 and
  // bf16 plans with their own caches.
  series llama{"decode_gqa", {1, 8}, {1}, {32}, {4096}, 0, one_and_all(hw)};
  llama.kv_heads = {8};
  llama.past = {8192};
  llama.precisions = {mha::precision::fp32, mha::precision::bf16};
  return {s, grouped, cache, long_context, llama};
}

std::vector<series> cores(int hw) {
  // Scaling past two cores: GPT-2 small's prefill for one sequence and four (a larger grid of
  // tasks), and decode over 8192 cached tokens for 1, 8 and 32 sequences (one sequence has 12
  // heads of work: only the split over keys feeds more threads) and with 3 K/V heads.
  const std::vector<int> t = doubling_to_all(hw);
  series prefill{"cores_prefill", {1, 4}, {gpt2_context}, {gpt2_heads}, {gpt2_d_model}, 0, t};
  series step{"cores_decode", {1, 8, 32}, {1}, {gpt2_heads}, {gpt2_d_model}, 0, t};
  step.past = {8192};
  series grouped{"cores_decode_kv", {1, 8}, {1}, {gpt2_heads}, {gpt2_d_model}, 0, t};
  grouped.kv_heads = {3};
  grouped.past = {8192};
  return {prefill, step, grouped};
}

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
  if (cache != plan && cache != mha::precision::int8) {
    return "the " + name + " KV cache with " + std::string(mha::to_string(plan)) +
           " plans (series " + series + "): a float cache is kept in its plan's precision";
  }
  return std::nullopt;
}

std::string format_seconds(double s) {
  char buffer[32];
  std::snprintf(buffer, sizeof buffer, "%.3g", s);
  return buffer;
}

}  // namespace

std::vector<int> doubling_to_all(int hardware_threads) {
  std::vector<int> t;
  for (int n = 1; n < hardware_threads; n *= 2) t.push_back(n);
  t.push_back(hardware_threads);
  return t;
}

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
                           mha::precision precision, std::optional<mha::precision> kv_precision) {
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
  return text + " threads=" + list(s.threads);
}

std::span<const std::string_view> preset_names() noexcept { return names; }

std::vector<series> preset(std::string_view name, int hardware_threads) {
  if (hardware_threads < 1) {
    throw mha::invalid_argument("mha_bench: hardware_threads (" + std::to_string(hardware_threads) +
                                ") must be >= 1");
  }
  if (name == "quick") return quick(hardware_threads);
  if (name == "heads") return heads(hardware_threads);
  if (name == "seq") return seq(hardware_threads);
  if (name == "threads") return threads(hardware_threads);
  if (name == "decode") return decode(hardware_threads);
  if (name == "cores") return cores(hardware_threads);
  if (name == "full") {
    std::vector<series> all;
    for (auto part : {quick, heads, seq, threads, decode, cores}) {
      for (series& s : part(hardware_threads)) all.push_back(std::move(s));
    }
    return all;
  }
  throw mha::invalid_argument("mha_bench: unknown preset '" + std::string(name) +
                              "'; expected one of " +
                              join(std::vector<std::string>(names.begin(), names.end()), ", "));
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
    for (auto [values, what] : {std::pair{&s.kv_heads, "kv_heads"},
                                std::pair{&s.kv_groups, "kv_groups"}, std::pair{&s.past, "past"}}) {
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
                    } else {
                      add_point(sweep_problem(b, t, d, h, kv, past, precision, cache));
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

shard parse_shard(std::string_view text) {
  const auto bad = [&]() -> shard {
    throw mha::invalid_argument("mha_bench: --shard '" + std::string(text) +
                                "': expected I/N with 1 <= I <= N, e.g. 2/4");
  };
  const std::size_t slash = text.find('/');
  if (slash == std::string_view::npos) return bad();
  const auto number = [&](std::string_view part, int& value) {
    const auto [end, ec] = std::from_chars(part.data(), part.data() + part.size(), value);
    return !part.empty() && ec == std::errc() && end == part.data() + part.size();
  };
  shard s;
  if (!number(text.substr(0, slash), s.index) || !number(text.substr(slash + 1), s.count) ||
      s.count < 1 || s.index < 1 || s.index > s.count) {
    return bad();
  }
  return s;
}

std::string to_string(shard s) { return std::to_string(s.index) + "/" + std::to_string(s.count); }

std::int64_t shard_cost(const bench_case& c) {
  // A nominal machine: the partition must not depend on the one it is computed on.
  constexpr double nominal_gflops_per_thread = 10.0, nominal_min_time = 0.5;
  const double run = mha::flops(c.problem) * 1e-9 / (nominal_gflops_per_thread * c.threads);
  return std::llround(expected_wall_seconds(run, nominal_min_time, 1) * 1e6);
}

std::vector<int> assign_shards(std::span<const bench_case> cases, int count) {
  if (count < 1) {
    throw mha::invalid_argument("mha_bench: a selection cannot be split into " +
                                std::to_string(count) + " shards");
  }
  std::vector<std::string> names;
  std::vector<std::int64_t> costs;
  for (const bench_case& c : cases) {
    names.push_back(c.name());
    costs.push_back(shard_cost(c));
  }
  std::vector<std::size_t> order(cases.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  // Longest first, then by name: the greedy "least loaded shard" rule balances best that way.
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    if (costs[a] != costs[b]) return costs[a] > costs[b];
    return names[a] < names[b];
  });
  std::vector<std::int64_t> load(static_cast<std::size_t>(count), 0);
  std::vector<int> assignment(cases.size(), 0);
  for (std::size_t i : order) {
    const auto least = std::min_element(load.begin(), load.end());  // the first of equals
    assignment[i] = static_cast<int>(least - load.begin());
    *least += costs[i];
  }
  return assignment;
}

std::vector<bench_case> cases_of_shard(std::span<const bench_case> cases, shard s) {
  const std::vector<int> assignment = assign_shards(cases, s.count);
  std::vector<bench_case> out;
  for (std::size_t i = 0; i < cases.size(); ++i) {
    if (assignment[i] == s.index - 1) out.push_back(cases[i]);
  }
  return out;
}

std::string selection_fingerprint(std::span<const bench_case> cases) {
  std::vector<std::string> names;
  for (const bench_case& c : cases) names.push_back(c.name());
  std::sort(names.begin(), names.end());
  std::uint64_t hash = 14695981039346656037ull;  // FNV-1a 64
  const auto add = [&](unsigned char byte) {
    hash ^= byte;
    hash *= 1099511628211ull;
  };
  for (const std::string& name : names) {
    for (char ch : name) add(static_cast<unsigned char>(ch));
    add('\n');
  }
  char buffer[17];
  std::snprintf(buffer, sizeof buffer, "%016llx", static_cast<unsigned long long>(hash));
  return buffer;
}

expansion shard_points(const expansion& e, std::span<const bench_case> cases, shard s) {
  const std::vector<int> assignment = assign_shards(cases, s.count);
  std::vector<bench_case> mine, earlier;
  for (std::size_t i = 0; i < cases.size(); ++i) {
    if (assignment[i] == s.index - 1) mine.push_back(cases[i]);
    if (assignment[i] < s.index - 1) earlier.push_back(cases[i]);
  }
  expansion out = covered_points(e, mine);
  const expansion taken = covered_points(e, earlier);
  std::erase_if(out.points, [&](const sweep_point& p) {
    return std::ranges::any_of(taken.points, [&](const sweep_point& q) {
      return q.problem == p.problem && q.threads == p.threads;
    });
  });
  return out;
}

double estimated_seconds(const bench_case& c, double gflops_one_thread) {
  return mha::flops(c.problem) * 1e-9 / (gflops_one_thread * c.threads);
}

std::optional<std::string> budget_skip_reason(double seconds, double budget_seconds) {
  if (budget_seconds <= 0 || seconds <= budget_seconds) return std::nullopt;
  return "over budget: estimated " + format_seconds(seconds) + " s per forward pass > --budget " +
         format_seconds(budget_seconds) + " s";
}

}  // namespace mha_bench
