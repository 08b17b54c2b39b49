// The `mha` command: subcommands, help, exit codes (0 success, 1 a check failed, 2 usage or
// input error with a one-line message naming the problem), and that run's options reach the plan.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "mha/backends/naive.hpp"
#include "mha/io.hpp"
#include "mha/registry.hpp"
#include "support.hpp"

namespace {

namespace fs = std::filesystem;
using mha_test::run_mha;
using testing::HasSubstr;

const fs::path golden = MHA_GOLDEN_DIR;

std::size_t lines(const std::string& s) {
  return static_cast<std::size_t>(std::count(s.begin(), s.end(), '\n'));
}

// Expects exit code 2 and one line naming every fragment.
void expect_usage_error(const std::vector<std::string>& args,
                        std::initializer_list<const char*> fragments) {
  const mha_test::command_result r = run_mha(args);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_EQ(lines(r.output), 1u) << r.output;
  for (const char* f : fragments) EXPECT_THAT(r.output, HasSubstr(f));
}

class Cli : public mha_test::scratch_test {
 protected:
  // `mha run` on the split_basic golden with extra arguments, writing dir_/y.npy.
  std::vector<std::string> run_args(std::initializer_list<std::string> extra) const {
    std::vector<std::string> args = {"run",
                                     "--weights",
                                     golden / "split_basic.safetensors",
                                     "--input",
                                     golden / "split_basic.x.npy",
                                     "--output",
                                     dir_ / "y.npy"};
    args.insert(args.end(), extra);
    return args;
  }
};

TEST_F(Cli, BackendsListsTheRegistry) {
  const mha_test::command_result r = run_mha({"backends"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (const mha::backend* b : mha::available_backends()) {
    EXPECT_THAT(r.output, HasSubstr(std::string(b->name())));
    EXPECT_THAT(r.output, HasSubstr(b->description()));
    std::string isa_column(mha::to_string(b->isa()));  // in its own column, between spaces
    isa_column.insert(isa_column.begin(), ' ');
    isa_column.push_back(' ');
    EXPECT_THAT(r.output, HasSubstr(isa_column));
  }
  // A line per backend and five feature lines under each.
  EXPECT_EQ(lines(r.output), 1 + 6 * mha::available_backends().size());
  // Each feature line says yes or why not, as supports() does.
  for (const mha::backend* b : mha::available_backends()) {
    mha::problem bf16;
    bf16.cfg = {.d_in = 64, .d_out = 64, .n_heads = 8, .context_length = 16};
    bf16.cfg.precision = mha::precision::bf16;
    const mha::support s = b->supports(bf16);
    const std::string answer = s ? "yes" : "declined: " + s.reason();
    // The backend's block: its line and the five feature lines under it.
    const std::size_t at = r.output.find("\n" + std::string(b->name()) + " ");
    ASSERT_NE(at, std::string::npos) << b->name();
    std::size_t end = at + 1;
    for (int line = 0; line < 6 && end != std::string::npos; ++line)
      end = r.output.find('\n', end + 1);
    const std::string block = r.output.substr(at + 1, end - at);
    EXPECT_THAT(block, HasSubstr("bf16           " + answer + "\n")) << b->name();
    const mha::support call = b->supports_attention(mha::precision::fp32);
    EXPECT_THAT(
        block,
        HasSubstr("attention-call " +
                  (call ? "yes (windows, soft-caps, sinks)" : "declined: " + call.reason()) + "\n"))
        << b->name();
    mha::problem windowed = bf16;
    windowed.cfg.precision = mha::precision::fp32;
    windowed.cfg.window = 4;
    const mha::support w = b->supports(windowed);
    EXPECT_THAT(block,
                HasSubstr("window         " + (w ? "yes" : "declined: " + w.reason()) + "\n"))
        << b->name();
  }
  EXPECT_THAT(r.output, testing::ContainsRegex("naive .*\n +grouped-query +yes"));
}

TEST_F(Cli, HelpOnEveryCommand) {
  for (const char* command : {"backends", "run", "verify"}) {
    const mha_test::command_result r = run_mha({command, "--help"});
    EXPECT_EQ(r.exit_code, 0) << command;
    EXPECT_THAT(r.output, HasSubstr(std::string("usage: mha ") + command));
  }
  const mha_test::command_result top = run_mha({"--help"});
  EXPECT_EQ(top.exit_code, 0);
  EXPECT_THAT(top.output, HasSubstr("exit codes"));
  EXPECT_EQ(run_mha({}).exit_code, 2) << "no command";
}

// Only a standalone --help/-h asks for help; as an option's value it is that value (issue 17 B).
TEST_F(Cli, HelpAsAnOptionValueIsAValue) {
  for (const char* value : {"-h", "--help"}) {
    const fs::path out = dir_ / value;
    const mha_test::command_result r =
        run_mha({"run", "--weights", golden / "split_basic.safetensors", "--input",
                 golden / "split_basic.x.npy", "--output", out.string()});
    EXPECT_EQ(r.exit_code, 0) << r.output;
    EXPECT_THAT(r.output, testing::Not(HasSubstr("usage:")));
    EXPECT_TRUE(fs::is_regular_file(out)) << value;
  }
  expect_usage_error(run_args({"--backend", "-h"}), {"unknown backend '-h'"});
  const mha_test::command_result help = run_mha(run_args({"--threads", "1", "-h"}));
  EXPECT_EQ(help.exit_code, 0);
  EXPECT_THAT(help.output, HasSubstr("usage: mha run"));
}

// Runs `mha args` with standard output sent to `out`; returns the exit code, stderr in err.
int run_redirected(const std::vector<std::string>& args, const std::string& out,
                   const fs::path& err_file, std::string& err) {
  std::string line = mha_test::mha_command_line();
  for (const std::string& a : args) line += " '" + a + "'";
  line += " >'" + out + "' 2>'" + err_file.string() + "'";
  const int status = std::system(line.c_str());
  std::ifstream in(err_file);
  err.assign(std::istreambuf_iterator<char>(in), {});
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// --output /dev/stdout writes through whatever standard output is: a pipe, or a regular file
// the shell opened (the same file afterwards, not a new one renamed over it) (issue 17 D).
TEST_F(Cli, OutputToStandardOutputIsWrittenThrough) {
  std::vector<std::string> args = run_args({});
  args[6] = "/dev/stdout";
  const mha_test::command_result piped = run_mha(args);
  EXPECT_EQ(piped.exit_code, 0) << piped.output;
  EXPECT_THAT(piped.output, HasSubstr("NUMPY"));
  const fs::path captured = dir_ / "captured";
  std::ofstream(captured) << "old";
  struct stat before {
  }, after{};
  ASSERT_EQ(::stat(captured.c_str(), &before), 0);
  std::string err;
  EXPECT_EQ(run_redirected(args, captured.string(), dir_ / "err.txt", err), 0) << err;
  ASSERT_EQ(::stat(captured.c_str(), &after), 0);
  EXPECT_EQ(before.st_ino, after.st_ino) << "the shell's file, not a new one";
  EXPECT_GT(after.st_size, 100);
  EXPECT_EQ(std::distance(fs::directory_iterator(dir_), fs::directory_iterator()), 2)
      << "no temporary file left";
}

// A failed write to standard output is an error, not a silent success (issue 17 C).
TEST_F(Cli, WriteErrorOnStandardOutputExitsTwo) {
  if (!fs::exists("/dev/full")) GTEST_SKIP() << "no /dev/full";
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"backends"}, std::vector<std::string>{"--help"},
        std::vector<std::string>{"run", "--help"},
        std::vector<std::string>{"verify", "--backend", "naive"}, run_args({})}) {
    std::string err;
    EXPECT_EQ(run_redirected(args, "/dev/full", dir_ / "err.txt", err), 2)
        << args[0] << ": " << err;
    EXPECT_THAT(err, HasSubstr("cannot write to standard output")) << args[0];
    EXPECT_EQ(lines(err), 1u) << err;
  }
}

// The library never prints: no runtime warning on stderr either, even with more threads than
// cores (oneTBB warns when an arena asks for more workers than it allows) (issue 17 I).
TEST_F(Cli, NothingOnStderrWithMoreThreadsThanCores) {
  for (const mha::backend* b : mha::available_backends()) {
    for (const char* form : {"wrapper", "split_weight"}) {
      std::string err;
      EXPECT_EQ(run_redirected(run_args({"--backend", std::string(b->name()), "--formulation", form,
                                         "--threads", "64"}),
                               "/dev/null", dir_ / "err.txt", err),
                0)
          << b->name();
      EXPECT_EQ(err, "") << b->name() << " " << form;
    }
  }
}

// A probability that rounds to 1 in float32 is refused as given, not as "dropout (1)".
TEST_F(Cli, DropoutIsReportedAsGiven) {
  expect_usage_error(run_args({"--training", "--dropout", "0.99999999"}),
                     {"'0.99999999'", "rounds to 1 in float32"});
  expect_usage_error(run_args({"--training", "--dropout", "1.5"}), {"[0, 1)", "'1.5'"});
  const mha_test::command_result r =
      run_mha(run_args({"--training", "--dropout", "0.99999994", "--backend", "naive"}));
  EXPECT_EQ(r.exit_code, 0) << r.output;
}

TEST_F(Cli, UsageErrorsExitTwoWithOneLine) {
  expect_usage_error({"frobnicate"}, {"unknown command 'frobnicate'"});
  expect_usage_error(run_args({"--frob"}), {"unknown option --frob"});
  expect_usage_error({"run", "--input", "x.npy"},
                     {"either --model DIR --layer N", "or --weights W.safetensors"});
  expect_usage_error(run_args({"--threads", "two"}), {"--threads expects an integer", "'two'"});
  expect_usage_error(run_args({"--threads", "-1"}), {"--threads", "'-1'"});
  expect_usage_error(run_args({"--heads"}), {"--heads needs a value"});
  expect_usage_error(run_args({"--seed", "1", "--seed", "2"}), {"--seed is given twice"});
  expect_usage_error(run_args({"--dropout", "0.1"}), {"--dropout", "--training"});
  expect_usage_error(run_args({"extra"}), {"unexpected argument 'extra'"});
  expect_usage_error(run_args({"--formulation", "fused"}), {"unknown formulation 'fused'"});
  expect_usage_error(run_args({"--backend", "gpu"}), {"unknown backend 'gpu'", "naive"});
  expect_usage_error(run_args({"--training", "--dropout", "1.5"}), {"--dropout", "'1.5'"});
}

TEST_F(Cli, InputErrorsExitTwoNamingTheProblem) {
  expect_usage_error(run_args({"--context-length", "4"}),
                     {"split_basic.x.npy", "6 tokens", "context_length 4"});
  expect_usage_error(run_args({"--context-length", "9"}),
                     {"context_length 9", "mask buffer (8, 8)"});
  expect_usage_error(run_args({"--heads", "4"}),
                     {"metadata num_heads gives 2", "(--heads) gives 4"});
  expect_usage_error({"run", "--weights", golden / "split_basic.safetensors", "--input",
                      golden / "wrapper_basic.x.npy", "--output", dir_ / "y.npy"},
                     {"wrapper_basic.x.npy", "(2, 5, 6)", "d_in = 8"});
  expect_usage_error({"run", "--weights", golden / "split_no_out_proj.safetensors", "--input",
                      golden / "split_no_out_proj.x.npy", "--output", dir_ / "y.npy"},
                     {"number of heads is unknown", "--heads"});
  expect_usage_error({"run", "--weights", golden / "split_basic.x.npy", "--input",
                      golden / "split_basic.x.npy", "--output", dir_ / "y.npy"},
                     {"split_basic.x.npy", "header length"});
  expect_usage_error({"run", "--weights", golden / "split_basic.safetensors", "--input",
                      golden / "split_basic.safetensors", "--output", dir_ / "y.npy"},
                     {"split_basic.safetensors", "not a .npy file"});
  expect_usage_error({"run", "--weights", golden / "split_basic.safetensors", "--input",
                      golden / "split_basic.x.npy", "--output", dir_ / "missing" / "y.npy"},
                     {"cannot create", "y.npy"});
  mha::io::write_npy(dir_ / "scalar.npy", {{}, {1.0f}});
  expect_usage_error({"run", "--weights", golden / "split_basic.safetensors", "--input",
                      dir_ / "scalar.npy", "--output", dir_ / "y.npy"},
                     {"scalar.npy", "shape ()", "(batch, tokens, d_in) or (tokens, d_in)"});
  mha::io::write_npy(dir_ / "empty.npy", {{0, 8}, {}});
  expect_usage_error({"run", "--weights", golden / "split_basic.safetensors", "--input",
                      dir_ / "empty.npy", "--output", dir_ / "y.npy"},
                     {"empty.npy", "shape (0, 8)", "all >= 1"});
  EXPECT_FALSE(fs::exists(dir_ / "y.npy")) << "no output after a failure";
}

// The loading options (--prefix, --heads, --kv-heads, --rope-base): what the file does not say,
// checked against what it says; the line printed names the layout and the block.
TEST_F(Cli, LoadingOptionsPickTheBlockAndMustAgreeWithTheFile) {
  auto run_golden = [&](const std::string& name, std::initializer_list<std::string> extra) {
    std::vector<std::string> args = {"run",
                                     "--weights",
                                     golden / (name + ".safetensors"),
                                     "--input",
                                     golden / (name + ".x.npy"),
                                     "--output",
                                     dir_ / "y.npy"};
    args.insert(args.end(), extra);
    return args;
  };
  const mha_test::command_result r =
      run_mha(run_golden("gpt2_model_h1", {"--heads", "2", "--prefix", "h.1.attn"}));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output,
              HasSubstr("gpt2-layout weights at 'h.1.attn.' (d_in=16 d_out=16 n_heads=2"));
  expect_usage_error(run_golden("gpt2_model_h1", {"--heads", "2"}),
                     {"gpt2_model_h1.safetensors",
                      "attention blocks at the 3 prefixes 'h.0.attn.', "
                      "'h.1.attn.' and 'h.2.attn.'",
                      "none at the top level", "--prefix"});
  expect_usage_error(run_golden("gpt2_model_h1", {"--heads", "2", "--prefix", "h.1."}),
                     {"no attention block at the prefix 'h.1.'", "'h.0.attn.'"});
  expect_usage_error(run_golden("gpt2_model_h1", {"--prefix", "h.1.attn."}),
                     {"number of heads is unknown", "--heads"});
  expect_usage_error(
      run_golden("llama_model_layer1", {"--heads", "4", "--prefix", "model.layers.1.self_attn."}),
      {"rotates queries and keys", "--rope-base"});
  expect_usage_error(
      run_golden("gqa_rope", {"--kv-heads", "4"}),
      {"K/V head counts disagree", "(--kv-heads) gives 4", "the shape of W_key.weight gives 2"});
  expect_usage_error(run_golden("gqa_rope", {"--rope-base", "500000"}),
                     {"rotary embedding bases disagree", "(--rope-base) gives 500000",
                      "the metadata rope_base gives 10000"});
  expect_usage_error(run_golden("gqa_rope", {"--rope-base", "-1"}), {"rope_base option (-1)"});
  expect_usage_error(run_golden("gqa_rope", {"--kv-heads", "0"}), {"--kv-heads", "'0'"});
  const mha_test::command_result gqa =
      run_mha(run_golden("gqa_rope", {"--backend", "naive", "--formulation", "fused_qkv"}));
  ASSERT_EQ(gqa.exit_code, 0) << gqa.output;
  EXPECT_THAT(gqa.output, HasSubstr("naive fused_qkv, split-layout weights (d_in=12 d_out=16 "
                                    "n_heads=4"));
  EXPECT_THAT(gqa.output, HasSubstr("n_kv_heads=2 rope_base=10000"));
}

TEST_F(Cli, TrainingOptionsReachThePlan) {
  const mha::io::tensor x = mha::io::read_npy(golden / "split_basic.x.npy");
  mha::io::loaded_module m = mha::io::load_module(golden / "split_basic.safetensors");
  m.cfg.dropout = 0.5f;
  const std::vector<float> inference = mha_test::forward(
      mha::naive_backend(), mha::formulation::wrapper, m.cfg, m.w, x.values, 2, 6);
  const std::vector<float> expected =
      mha_test::forward(mha::naive_backend(), mha::formulation::wrapper, m.cfg, m.w, x.values, 2, 6,
                        {.threads = 1, .training = true, .seed = 3});
  ASSERT_NE(expected, inference) << "dropout 0.5 changes the output";

  const mha_test::command_result r =
      run_mha(run_args({"--backend", "naive", "--formulation", "wrapper", "--training", "--dropout",
                        "0.5", "--seed", "3", "--threads", "1"}));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(mha::io::read_npy(dir_ / "y.npy").values, expected);
}

// --precision bf16 prepares a bf16 plan: y is that plan's, bit for bit, on every backend that
// computes bf16, and not the fp32 one; a backend that declines bf16 exits 2 with its reason.
TEST_F(Cli, PrecisionOptionReachesThePlan) {
  const mha::io::tensor x = mha::io::read_npy(golden / "split_basic.x.npy");
  mha::io::loaded_module m = mha::io::load_module(golden / "split_basic.safetensors");
  const std::vector<float> fp32 = mha_test::forward(
      mha::naive_backend(), mha::formulation::split_weight, m.cfg, m.w, x.values, 2, 6);
  m.cfg.precision = mha::precision::bf16;
  for (const mha::backend* b : mha::available_backends()) {
    const std::string name(b->name());
    const std::vector<std::string> args =
        run_args({"--backend", name, "--precision", "bf16", "--threads", "1"});
    if (const mha::support s = b->supports({m.cfg, mha::formulation::split_weight}); !s) {
      expect_usage_error(args, {name.c_str(), "bf16"});
      continue;
    }
    const std::vector<float> bf16 = mha_test::forward(*b, mha::formulation::split_weight, m.cfg,
                                                      m.w, x.values, 2, 6, {.threads = 1});
    ASSERT_NE(bf16, fp32) << name << ": bf16 rounding changes the output";
    const mha_test::command_result r = run_mha(args);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_THAT(r.output, HasSubstr("precision=bf16"));
    EXPECT_EQ(mha::io::read_npy(dir_ / "y.npy").values, bf16) << name;
  }
  expect_usage_error(run_args({"--precision", "fp16"}),
                     {"precision 'fp16'", "fp32, bf16, int8, k8v4 or int4"});
}

TEST_F(Cli, ContextLengthOptionWithoutMask) {
  // No mask in the file: any T runs unless --context-length caps it.
  mha::io::tensor_file f = mha::io::read_safetensors(golden / "split_basic.safetensors");
  f.tensors.erase("mask");
  mha::io::write_safetensors(dir_ / "w.safetensors", f);
  mha::io::write_npy(dir_ / "x.npy", {{20, 8}, mha_test::random_floats(160, 4)});
  const std::vector<std::string> args = {"run",         "--weights",    dir_ / "w.safetensors",
                                         "--input",     dir_ / "x.npy", "--output",
                                         dir_ / "y.npy"};
  const mha_test::command_result r = run_mha(args);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(mha::io::read_npy(dir_ / "y.npy").shape, (std::vector<std::int64_t>{20, 8}));
  std::vector<std::string> capped = args;
  capped.insert(capped.end(), {"--context-length", "19"});
  expect_usage_error(capped, {"20 tokens", "context_length 19"});
}

// --incremental writes the full forward's y on every backend that decodes, whatever the
// prefill and chunk (bit for bit where mha_test::decodes_bitwise, else within twice the
// conformance bound); one that declines decode exits 2 naming the reason.
TEST_F(Cli, IncrementalRunWritesTheFullForward) {
  for (const mha::backend* b : mha::available_backends()) {
    for (const char* form : {"wrapper", "split_weight"}) {
      const std::string name(b->name());
      ASSERT_EQ(run_mha(run_args({"--backend", name, "--formulation", form})).exit_code, 0);
      const std::vector<float> full = mha::io::read_npy(dir_ / "y.npy").values;
      fs::remove(dir_ / "y.npy");
      const mha::io::loaded_module m = mha::io::load_module(golden / "split_basic.safetensors");
      const mha::support s = b->supports({m.cfg, mha::parse_formulation(form), 2, 1, /*past=*/5});
      for (const auto& steps : std::vector<std::vector<std::string>>{
               {}, {"--prefill", "4"}, {"--prefill", "6", "--chunk", "1"}, {"--chunk", "4"}}) {
        std::vector<std::string> args =
            run_args({"--backend", name, "--formulation", form, "--incremental"});
        args.insert(args.end(), steps.begin(), steps.end());
        if (!s) {
          expect_usage_error(args, {"decode with a KV cache", name.c_str()});
          continue;
        }
        const mha_test::command_result r = run_mha(args);
        ASSERT_EQ(r.exit_code, 0) << r.output;
        EXPECT_THAT(r.output, HasSubstr("through a KV cache")) << r.output;
        const std::vector<float> y = mha::io::read_npy(dir_ / "y.npy").values;
        if (mha_test::decodes_bitwise(*b)) {
          EXPECT_EQ(y, full) << name << " " << form;
        } else {
          EXPECT_LE(mha_test::max_abs_diff(y, full), 2e-5 * mha_test::max_abs(full))
              << name << " " << form;
        }
      }
    }
  }
  expect_usage_error(run_args({"--prefill", "2"}), {"--prefill", "--incremental"});
  expect_usage_error(run_args({"--chunk", "2"}), {"--chunk", "--incremental"});
  expect_usage_error(run_args({"--incremental", "--prefill", "7"}), {"--prefill", "'7'"});
  expect_usage_error(run_args({"--incremental", "--chunk", "0"}), {"--chunk", "'0'"});
}

// --kv-precision int8 (k8v4, int4) keeps the cache as codes (docs/design.md §1.7): y near the full
// forward's, not equal to it (k8v4's 4-bit values further); the option needs --incremental and a
// precision's name.
TEST_F(Cli, IncrementalRunKeepsTheCacheInTheGivenPrecision) {
  ASSERT_EQ(run_mha(run_args({"--backend", "naive"})).exit_code, 0);
  const std::vector<float> full = mha::io::read_npy(dir_ / "y.npy").values;
  double int8_error = 0.0;
  for (const auto& [kv, within] : {std::pair{"int8", 1e-2}, std::pair{"k8v4", 1e-1}}) {
    fs::remove(dir_ / "y.npy");
    const mha_test::command_result r =
        run_mha(run_args({"--backend", "naive", "--incremental", "--kv-precision", kv}));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_THAT(r.output, HasSubstr(std::string("through a KV cache of ") + kv)) << r.output;
    const double error = mha_test::max_abs_diff(mha::io::read_npy(dir_ / "y.npy").values, full);
    EXPECT_GT(error, int8_error) << kv;  // lossy; k8v4 more than int8
    EXPECT_LE(error, within * mha_test::max_abs(full)) << kv;
    int8_error = error;
  }
  // int4: k8v4's values, 4-bit keys per channel group of 64 tokens (these few kept exact).
  fs::remove(dir_ / "y.npy");
  const mha_test::command_result r =
      run_mha(run_args({"--backend", "naive", "--incremental", "--kv-precision", "int4"}));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("through a KV cache of int4")) << r.output;
  const double int4_error = mha_test::max_abs_diff(mha::io::read_npy(dir_ / "y.npy").values, full);
  EXPECT_GT(int4_error, 0.0);
  EXPECT_LE(int4_error, 1e-1 * mha_test::max_abs(full));
  expect_usage_error(run_args({"--kv-precision", "int8"}), {"--kv-precision", "--incremental"});
  expect_usage_error(run_args({"--incremental", "--kv-precision", "int2"}),
                     {"unknown precision 'int2'"});
}

TEST_F(Cli, VerifyPassesEveryBackendAndFormulation) {
  const mha_test::command_result r = run_mha({"verify"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::size_t rows = lines(r.output) - 2;  // header and summary
  // Every formulation in both precisions.
  EXPECT_EQ(rows % (2 * mha::formulations().size() * mha::available_backends().size()), 0u);
  // A declined problem gets its row with the reason, and is neither a pass nor a failure.
  std::size_t declined = 0;
  for (std::size_t at = r.output.find("declined: "); at != std::string::npos;
       at = r.output.find("declined: ", at + 1))
    ++declined;
  const std::size_t run = rows - declined;
  EXPECT_THAT(r.output, HasSubstr(std::to_string(run) + " of " + std::to_string(run) + " passed"));
  if (declined > 0) {
    EXPECT_THAT(r.output, HasSubstr(std::to_string(declined) + " declined by their backend"));
  }
  // naive computes grouped K/V heads.
  EXPECT_THAT(r.output, testing::ContainsRegex("naive +split_weight/[^ ]*/kvh2 .* pass"));
  // ... and bf16, against the oracle of the same rounding, with fused_qkv among the forms.
  EXPECT_THAT(r.output, testing::ContainsRegex("naive +fused_qkv/[^ ]*/bf16 .* pass"));
  EXPECT_THAT(r.output, HasSubstr("3.9e-03 bf16"));
  EXPECT_THAT(r.output, testing::Not(HasSubstr("FAIL")));
  for (const mha::backend* b : mha::available_backends()) {
    EXPECT_THAT(r.output, HasSubstr(std::string(b->name()) + " "));
  }
}

TEST_F(Cli, VerifyExitsOneWhenACheckFails) {
  // No float computation matches the double reference to 0.
  const mha_test::command_result r = run_mha({"verify", "--backend", "naive", "--tolerance", "0"});
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_THAT(r.output, HasSubstr("FAIL"));
  expect_usage_error({"verify", "--backend", "nosuch"}, {"unknown backend 'nosuch'"});
  expect_usage_error({"verify", "--precision", "fp32,fp16"},
                     {"unknown precision 'fp16'", "fp32, bf16, int8, k8v4 or int4"});
}

}  // namespace
