#include "support.hpp"

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <random>
#include <sstream>

#include "mha/build_config.hpp"
#include "mha/registry.hpp"
#if MHA_WITH_XSIMD
#include "mha/backends/xsimd.hpp"
#endif

namespace mha_test {

mha::config shape::config() const {
  mha::config c;
  c.d_in = d_in;
  c.d_out = d_out;
  c.n_heads = n_heads;
  c.context_length = seq_len;
  c.causal = causal;
  c.qkv_bias = qkv_bias;
  c.out_proj = out_proj;
  c.n_kv_heads = n_kv_heads;
  c.rope_base = rope_base;
  c.out_proj_bias = out_proj_bias;
  c.rope_scaling = rope_scaling;
  return c;
}

std::string shape::name() const {
  std::ostringstream s;
  s << "b" << batch << "_t" << seq_len << "_din" << d_in << "_dout" << d_out << "_h" << n_heads;
  if (n_kv_heads > 0) s << "_kvh" << n_kv_heads;
  if (!causal) s << "_noncausal";
  if (qkv_bias) s << "_qkvbias";
  if (!out_proj) s << "_noproj";
  if (rope_base != 0.0) s << "_rope" << static_cast<long long>(rope_base);
  if (rope_scaling.kind == mha::rope_scaling::type::linear) {
    s << "_linear" << static_cast<long long>(rope_scaling.factor);
  }
  if (rope_scaling.kind == mha::rope_scaling::type::llama3) s << "_llama3";
  if (out_proj && !out_proj_bias) s << "_nooutbias";
  return s.str();
}

const std::vector<shape>& conformance_shapes() {
  //                               B   T  d_in d_out  H  causal bias  proj
  static const std::vector<shape> shapes = {
      {1, 1, 8, 8, 1},                           // T = 1: one token, one head
      {1, 2, 5, 6, 3},                           // head_dim 2, d_in odd
      {3, 7, 12, 9, 3, true, true, true},        // head_dim 3 (odd), biases, batch 3
      {1, 17, 16, 12, 12},                       // head_dim 1
      {3, 64, 32, 48, 4, true, false, false},    // no out_proj
      {1, 65, 24, 40, 4, false},                 // non-causal, T one past a power of two
      {1, 17, 40, 192, 96},                      // 96 heads of head_dim 2
      {3, 65, 96, 96, 96, false, true, true},    // 96 heads of head_dim 1, non-causal, biases
      {1, 64, 64, 64, 1},                        // one wide head
      {3, 2, 7, 5, 1, false, true, false},       // head_dim 5, everything off but bias
      {1, 65, 33, 36, 12, true, true, true},     // 12 heads of head_dim 3, biases
      {3, 17, 20, 12, 4, false, false, false},   // non-causal, no out_proj
      {1, 7, 16, 24, 3},                         // head_dim 8
      {1, 64, 48, 80, 16},                       // head_dim 5, 16 heads
      {3, 1, 9, 8, 4},                           // T = 1 with batch 3
      {1, 65, 32, 17, 1},                        // head_dim 17: one past a register
      {1, 33, 31, 99, 3, true, true, true},      // head_dim 33, every tail at once
      {3, 33, 24, 64, 2, true, true, true},      // head_dim 32: whole panels (head-major Q/K/V)
      {2, 600, 16, 32, 4, true, true, true},     // T past the fused kernel's 512-key tile
      {3, 17, 20, 24, 6, true, false, true, 2},  // grouped-query: 3 query heads per K/V head
      {1, 65, 24, 32, 8, false, true, true, 1},  // multi-query, non-causal, biases
      // Rotary embedding: head_dim 8 at base 10000; head_dim 16 past a key tile with GQA and
      // Llama 3's base, no biases anywhere (a Llama block); multi-query at head_dim 2.
      {1, 33, 16, 32, 4, true, false, true, 0, 10000.0},
      {2, 600, 32, 64, 4, true, false, true, 2, 500000.0, false},
      {3, 17, 12, 16, 8, true, true, true, 1, 10000.0},
      // Scaled rotary embeddings: Llama 3.1's at head_dim 16 with an original context of 64, so
      // that its pairs fall in all three bands (wavelengths 6.3 kept, 20 and 63 blended, 199 and
      // up slowed 8x); linear by 4 with biases.
      {1,
       40,
       32,
       64,
       4,
       true,
       false,
       true,
       2,
       10000.0,
       false,
       {mha::rope_scaling::type::llama3, 8.0, 1.0, 4.0, 64}},
      {3,
       17,
       12,
       16,
       4,
       true,
       true,
       true,
       0,
       10000.0,
       true,
       {mha::rope_scaling::type::linear, 4.0}},
  };
  return shapes;
}

const std::vector<backend_case>& backend_cases() {
  static const std::vector<backend_case> cases = [] {
    std::vector<backend_case> list;
    for (const mha::backend* b : mha::available_backends())
      list.push_back({std::string(b->name()), b});
#if MHA_WITH_XSIMD
    // Every other ISA this CPU runs ("xsimd" itself is the dispatched one).
    for (mha::isa isa : mha::xsimd_supported_isas()) {
      if (isa != mha::xsimd_default_isa())
        list.push_back({"xsimd_" + std::string(mha::to_string(isa)), &mha::xsimd_backend(isa)});
    }
#endif
    return list;
  }();
  return cases;
}

std::vector<backend_case> attention_backend_cases() {
  std::vector<backend_case> cases;
  for (const backend_case& b : backend_cases()) {
    if (b.backend->supports_attention(mha::precision::fp32)) cases.push_back(b);
  }
  return cases;
}

std::string conformance_param_name(const testing::TestParamInfo<conformance_param>& info) {
  const auto& [backend, form, s] = info.param;
  return backend.label + "_" + std::string(mha::to_string(form)) + "_" + s.name();
}

bool claims(const backend_case& b, const mha::problem& p) {
  // A KV cache keeps the plan's precision, or int8 on every backend but oneDNN.
  if (p.cache_precision() != p.cfg.precision) {
    return p.cache_precision() == mha::precision::int8 && b.backend->name() != "onednn";
  }
  // oneDNN computes bf16 where its kernels are bf16-native (AVX512_BF16 or AMX).
  if (p.cfg.precision == mha::precision::bf16 && b.backend->name() == "onednn") {
    return mha::native_bf16(b.backend->isa());
  }
  return true;
}

bool decodes_bitwise(const mha::backend& b) { return b.name() != "onednn"; }

std::optional<std::string> declined(const backend_case& b, const mha::problem& p) {
  const mha::support s = b.backend->supports(p);
  if (s) return std::nullopt;
  if (claims(b, p)) {
    ADD_FAILURE() << b.label << " declines " << mha::to_string(p)
                  << ", which it claims: " << s.reason();
  }
  return "declined by " + b.label + ": " + s.reason();
}

std::vector<float> random_floats(std::size_t n, std::uint32_t seed, float scale) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(-scale, scale);
  std::vector<float> v(n);
  for (float& e : v) e = dist(gen);
  return v;
}

shape_inputs inputs_of(const mha::config& cfg, const shape& s, float input_scale) {
  return {mha::weights::random(cfg, 1234),
          random_floats(static_cast<std::size_t>(s.batch * s.seq_len * s.d_in), 99, input_scale)};
}

std::vector<float> forward(const mha::backend& backend, mha::formulation form,
                           const mha::config& cfg, const mha::weights& w,
                           const std::vector<float>& x, std::int64_t batch, std::int64_t seq_len,
                           const mha::run_options& options) {
  const auto plan = backend.prepare(cfg, form, w);
  std::vector<float> y(static_cast<std::size_t>(batch * seq_len * cfg.d_out),
                       std::numeric_limits<float>::quiet_NaN());
  plan->run({x.data(), batch, seq_len, cfg.d_in}, {y.data(), batch, seq_len, cfg.d_out}, options);
  return y;
}

double max_abs(const std::vector<double>& v) {
  double m = 0.0;
  for (double e : v) m = std::max(m, std::abs(e));
  return m;
}

double max_abs(const std::vector<float>& v) {
  double m = 0.0;
  for (float e : v) m = std::max(m, std::abs(static_cast<double>(e)));
  return m;
}

template <class A, class B>
static double max_diff(const A& a, const B& b) {
  if (a.size() != b.size()) return std::numeric_limits<double>::infinity();
  double m = 0.0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    const double d = std::abs(static_cast<double>(a[i]) - static_cast<double>(b[i]));
    if (std::isnan(d)) return d;
    m = std::max(m, d);
  }
  return m;
}

double max_abs_diff(const std::vector<float>& a, const std::vector<double>& b) {
  return max_diff(a, b);
}
double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  return max_diff(a, b);
}

namespace {

// 'text' for /bin/sh, with embedded quotes closed, escaped and reopened.
std::string shell_quoted(const std::string& text) {
  std::string q = "'";
  for (char c : text) {
    if (c == '\'') {
      q += "'\\''";
    } else {
      q += c;
    }
  }
  return q + "'";
}

}  // namespace

void expect_same_weights(const mha::weights& a, const mha::weights& b) {
  for (auto [x, y] : {std::pair{&a.query, &b.query},
                      {&a.key, &b.key},
                      {&a.value, &b.value},
                      {&a.out_proj, &b.out_proj}}) {
    EXPECT_EQ(x->out, y->out);
    EXPECT_EQ(x->in, y->in);
    EXPECT_EQ(x->weight, y->weight);
    EXPECT_EQ(x->bias, y->bias);
  }
}

void scratch_test::SetUp() {
  const testing::TestInfo* info = testing::UnitTest::GetInstance()->current_test_info();
  std::string name = std::string(info->test_suite_name()) + "." + info->name();
  std::replace(name.begin(), name.end(), '/', '_');
  dir_ = std::filesystem::temp_directory_path() /
         ("mha_test_" + std::to_string(getpid()) + "_" + name);
  std::filesystem::create_directories(dir_);
}

void scratch_test::TearDown() { std::filesystem::remove_all(dir_); }

std::string emulator() {
  const char* named = std::getenv("MHA_TEST_EMULATOR");
  return named != nullptr ? named : "";
}

std::string mha_command_line() {
  const std::string path = shell_quoted(MHA_CLI_PATH);
  return emulator().empty() ? path : shell_quoted(emulator()) + ' ' + path;
}

command_result run_mha(const std::vector<std::string>& args) {
  std::string line = mha_command_line();
  for (const std::string& a : args) {
    line += ' ';
    line += shell_quoted(a);
  }
  line += " 2>&1";
  command_result result;
  FILE* pipe = popen(line.c_str(), "r");
  if (pipe == nullptr) return result;
  std::array<char, 4096> chunk;
  while (std::size_t n = std::fread(chunk.data(), 1, chunk.size(), pipe)) {
    result.output.append(chunk.data(), n);
  }
  const int status = pclose(pipe);
  if (status != -1 && WIFEXITED(status)) result.exit_code = WEXITSTATUS(status);
  return result;
}

}  // namespace mha_test
