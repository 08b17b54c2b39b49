#include "command_line.hpp"

#include <charconv>
#include <functional>
#include <map>

#include "mha/error.hpp"

namespace mha_bench {
namespace {

[[noreturn]] void fail(std::string_view flag, std::string_view value, std::string_view expected) {
  throw mha::invalid_argument("mha_bench: " + std::string(flag) + " '" + std::string(value) +
                              "': expected " + std::string(expected));
}

template <class T>
T parse_number(std::string_view flag, std::string_view text, std::string_view expected) {
  T value{};
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size()) fail(flag, text, expected);
  return value;
}

std::vector<std::string> split(std::string_view flag, std::string_view text) {
  std::vector<std::string> items;
  std::size_t begin = 0;
  while (true) {
    const std::size_t comma = text.find(',', begin);
    const std::string_view item = text.substr(begin, comma - begin);
    if (item.empty()) fail(flag, text, "a comma-separated list without empty items");
    items.emplace_back(item);
    if (comma == std::string_view::npos) return items;
    begin = comma + 1;
  }
}

// A comma-separated list of integers, each >= `least` (0 or 1).
template <class T>
std::vector<T> list_of_at_least(T least, std::string_view flag, std::string_view text) {
  const std::string expected =
      "a comma-separated list of integers >= " + std::to_string(static_cast<int>(least));
  std::vector<T> values;
  for (const std::string& item : split(flag, text)) {
    const T v = parse_number<T>(flag, item, expected);
    if (v < least) fail(flag, text, expected);
    values.push_back(v);
  }
  return values;
}

template <class T>
std::vector<T> positive_list(std::string_view flag, std::string_view text) {
  return list_of_at_least(T{1}, flag, text);
}

template <class T>
std::vector<T> non_negative_list(std::string_view flag, std::string_view text) {
  return list_of_at_least(T{0}, flag, text);
}

double non_negative(std::string_view flag, std::string_view text) {
  const double v = parse_number<double>(flag, text, "a number of seconds >= 0");
  if (!(v >= 0)) fail(flag, text, "a number of seconds >= 0");
  return v;
}

}  // namespace

options parse_command_line(std::span<const std::string> args) {
  options o;
  using setter = std::function<void(std::string_view flag, std::string_view value)>;
  const std::map<std::string_view, setter> with_value = {
      {"--preset", [&](auto, auto v) { o.preset = v; }},
      {"--backends", [&](auto f, auto v) { o.backends = split(f, v); }},
      {"--formulations",
       [&](auto f, auto v) {
         o.formulations.clear();
         for (const std::string& name : split(f, v))
           o.formulations.push_back(mha::parse_formulation(name));
       }},
      {"--batch", [&](auto f, auto v) { o.lists.batch = positive_list<std::int64_t>(f, v); }},
      {"--seq", [&](auto f, auto v) { o.lists.seq_len = positive_list<std::int64_t>(f, v); }},
      {"--heads", [&](auto f, auto v) { o.lists.heads = positive_list<std::int64_t>(f, v); }},
      {"--d-model", [&](auto f, auto v) { o.lists.d_model = positive_list<std::int64_t>(f, v); }},
      {"--threads", [&](auto f, auto v) { o.lists.threads = positive_list<int>(f, v); }},
      {"--kv-heads",
       [&](auto f, auto v) { o.lists.kv_heads = non_negative_list<std::int64_t>(f, v); }},
      {"--past", [&](auto f, auto v) { o.lists.past = non_negative_list<std::int64_t>(f, v); }},
      {"--window", [&](auto f, auto v) { o.lists.window = non_negative_list<std::int64_t>(f, v); }},
      {"--precision",
       [&](auto f, auto v) {
         std::vector<mha::precision> list;
         for (const std::string& name : split(f, v)) list.push_back(mha::parse_precision(name));
         o.lists.precisions = list;
       }},
      {"--kv-precision",
       [&](auto f, auto v) {
         std::vector<mha::precision> list;
         for (const std::string& name : split(f, v)) list.push_back(mha::parse_precision(name));
         o.lists.kv_precisions = list;
       }},
      {"--budget", [&](auto f, auto v) { o.budget_seconds = non_negative(f, v); }},
      {"--dump-shapes", [&](auto, auto v) { o.dump_shapes = v; }},
      {"--dump-inputs", [&](auto, auto v) { o.dump_inputs = v; }},
      {"--trace", [&](auto, auto v) { o.trace = v; }},
      {"--trace-runs",
       [&](auto f, auto v) {
         o.trace_runs = parse_number<int>(f, v, "a whole number >= 1");
         if (o.trace_runs < 1) fail(f, v, "a whole number >= 1");
       }},
      {"--shard", [&](auto, auto v) { o.shard = parse_shard(v); }},
      {"--tolerance",
       [&](auto f, auto v) {
         o.tolerance = parse_number<double>(f, v, "a number > 0");
         if (!(o.tolerance > 0)) fail(f, v, "a number > 0");
       }},
  };
  const std::map<std::string_view, bool*> switches = {{"--quiet", &o.quiet},
                                                      {"--list-shapes", &o.list_shapes}};

  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string_view arg = args[i];
    const std::size_t eq = arg.find('=');
    const std::string_view flag = arg.substr(0, eq);
    if (const auto s = switches.find(flag); s != switches.end() && eq == std::string_view::npos) {
      *s->second = true;
    } else if (const auto w = with_value.find(flag); w != with_value.end()) {
      if (eq != std::string_view::npos) {
        w->second(flag, arg.substr(eq + 1));
      } else if (i + 1 < args.size()) {
        w->second(flag, args[++i]);
      } else {
        throw mha::invalid_argument("mha_bench: " + std::string(flag) + " needs a value");
      }
    } else {
      throw mha::invalid_argument("mha_bench: unknown argument '" + std::string(arg) +
                                  "' (--help lists the flags)");
    }
  }
  return o;
}

std::string usage(std::string_view program) {
  const auto names = preset_names();
  const std::string presets = join(std::vector<std::string>(names.begin(), names.end()), "|");
  return "usage: " + std::string(program) + " [--preset " + presets +
         "] [overrides] [--benchmark_* flags]\n"
         "\n"
         "Measures every built backend x formulation x shape x thread count of a preset "
         "(bench/README.md).\n"
         "\n"
         "  --preset NAME         quick (default): 6 GPT-2-wide shapes, a minute or two;\n"
         "                        heads: H = 1..96 at d_model 768 (B4 T256) and at head_dim 64 (B1 "
         "T128);\n"
         "                        seq: T = 64..4096 at GPT-2 small; threads: 1..nproc at GPT-2 "
         "small;\n"
         "                        decode: one token over 128..32768 cached tokens, B 1..32,\n"
         "                        and verification steps of 2..16 tokens over 2k..32k;\n"
         "                        window: sliding windows 512 and 4096 beside causal, prefill\n"
         "                        and decode over 4k..32k tokens;\n"
         "                        cores: prefill B1/B4 and decode over 8k at 1, 2, 4, ..., "
         "nproc threads;\n"
         "                        full: all of them\n"
         "  --backends a,b        backends to measure (default: every one built, best first)\n"
         "  --formulations a,b    wrapper, split_weight, fused_qkv (default: all three)\n"
         "  --batch, --seq, --heads, --d-model, --threads LIST\n"
         "                        replace that list in every series of the preset (--d-model "
         "leaves\n"
         "                        the fixed-head_dim series alone); shapes whose d_model is not\n"
         "                        divisible by H are dropped, with a notice\n"
         "  --kv-heads, --past LIST\n"
         "                        K/V heads (0 = H; H not divisible by it is dropped) and cached\n"
         "                        tokens before each call (decode); default 0\n"
         "  --window LIST         sliding windows (0 = plain causal attention; a window covering\n"
         "                        every key of a shape is dropped, with a notice); default 0\n"
         "  --precision LIST      fp32,bf16 (default fp32)\n"
         "  --kv-precision LIST   the KV cache's: fp32,bf16,int8,k8v4,int4 (default: the plan's "
         "own; a\n"
         "                        float cache runs with plans of its precision only)\n"
         "                        a backend that declines a problem (mha backends says which)\n"
         "                        is not run; the result file's context lists it (mha_declined)\n"
         "  --budget SECONDS      skip cases whose forward pass is estimated slower (default 5; 0 "
         "= none)\n"
         "  --tolerance X         check: max|y - reference| <= X * max|reference| (default 1e-4)\n"
         "  --list-shapes         print the shapes and thread counts of the sweep, then exit\n"
         "  --dump-shapes FILE    write the shapes and thread counts the selected benchmarks run\n"
         "                        (after --backends and --benchmark_filter) as JSON for\n"
         "                        python3 -m mhapy.peers --shapes, then exit\n"
         "  --dump-inputs DIR     write each selected shape's inputs (weights, x) and the\n"
         "                        oracle on the checked rows to DIR/<problem>.safetensors, then\n"
         "                        exit (what tools/tests pin mhapy.inputs and mhapy.oracle to)\n"
         "  --trace FILE          run each selected tbb case --trace-runs times (default 5) under "
         "a\n"
         "                        task trace and write the median run's phases and task times,\n"
         "                        with the streaming read at 1, 2, 4, ... threads, to FILE as\n"
         "                        JSON (the scaling model's input: python3 -m mhapy.report\n"
         "                        --trace FILE), then exit\n"
         "  --shard I/N           run part I of N of the selected benchmarks (after --backends\n"
         "                        and --benchmark_filter): a deterministic partition by name,\n"
         "                        balanced by model FLOPs; the context says which (mha_shard)\n"
         "  --quiet               no progress lines on stderr\n"
         "\n"
         "Google Benchmark 1.7.1 flags work alongside, e.g. --benchmark_filter=REGEX,\n"
         "--benchmark_out=FILE --benchmark_out_format=json, --benchmark_repetitions=N,\n"
         "--benchmark_min_time=SECONDS (a plain number in 1.7.1: 0.2, not 0.2s).\n";
}

double benchmark_flag(std::span<const std::string> args, std::string_view name, double fallback) {
  const std::string prefix = "--" + std::string(name) + "=";
  for (const std::string& arg : args) {
    if (!arg.starts_with(prefix)) continue;
    const std::string_view text = std::string_view(arg).substr(prefix.size());
    double value = 0;
    const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
    if (ec == std::errc() && end == text.data() + text.size()) fallback = value;
  }
  return fallback;
}

}  // namespace mha_bench
