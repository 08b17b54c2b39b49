// safetensors and .npy: round trips, dtype conversions and files (the malformed-file catalogue:
// test_io_malformed.cpp).
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <string>
#include <thread>

#include "io/file_bytes.hpp"
#include "mha/error.hpp"
#include "mha/io.hpp"
#include "support.hpp"

namespace {

namespace io = mha::io;
using namespace mha_test::io_files;
using mha_test::expect_error;

// ---- round trips ----

TEST(Npy, RoundTripsEveryRank) {
  for (const std::vector<std::int64_t>& shape :
       std::vector<std::vector<std::int64_t>>{{}, {0}, {5}, {2, 3}, {2, 0, 4}, {2, 3, 4}}) {
    std::int64_t n = 1;
    for (std::int64_t d : shape) n *= d;
    const io::tensor t{shape, mha_test::random_floats(static_cast<std::size_t>(n), 3)};
    const std::vector<std::byte> bytes = io::npy_bytes(t);
    EXPECT_EQ(bytes.size() % 64, static_cast<std::size_t>(n * 4) % 64) << "header aligned to 64";
    const io::tensor back = io::parse_npy(bytes);
    EXPECT_EQ(back.shape, t.shape);
    EXPECT_EQ(back.values, t.values);
  }
}

TEST(Npy, ReadsFloat64RoundingToFloat32) {
  std::vector<std::byte> file = npy("{'descr': '<f8', 'fortran_order': False, 'shape': (2,), }", 0);
  append(file, std::bit_cast<std::uint64_t>(0.1), 8);
  append(file, std::bit_cast<std::uint64_t>(-1e300), 8);
  const io::tensor t = io::parse_npy(file);
  ASSERT_EQ(t.shape, (std::vector<std::int64_t>{2}));
  EXPECT_EQ(t.values[0], 0.1f);
  EXPECT_EQ(t.values[1], -std::numeric_limits<float>::infinity());
}

TEST(Npy, AcceptsWhatNumpyWritesAndOtherSpacing) {
  // Version 2.0, double quotes, no trailing commas, tabs and newlines between tokens.
  const io::tensor t = io::parse_npy(
      npy("{\"shape\":(1,2)\t,\n'fortran_order':False,'descr':'<f4'}  \n", 8, 2), "x.npy");
  EXPECT_EQ(t.shape, (std::vector<std::int64_t>{1, 2}));
  EXPECT_EQ(t.values, (std::vector<float>{0.0f, 0.0f}));
}

TEST(Safetensors, RoundTripsTensorsAndMetadata) {
  io::tensor_file f;
  f.tensors["a.weight"] = {{2, 3}, mha_test::random_floats(6, 1)};
  f.tensors["b"] = {{4}, mha_test::random_floats(4, 2)};
  f.tensors["scalar"] = {{}, {7.0f}};
  f.tensors["empty"] = {{0, 5}, {}};
  f.metadata["num_heads"] = "12";
  const std::vector<std::byte> bytes = io::safetensors_bytes(f);
  std::uint64_t header_length = 0;
  for (int i = 7; i >= 0; --i)
    header_length = (header_length << 8) | std::to_integer<unsigned>(bytes[i]);
  EXPECT_EQ(header_length % 8, 0u) << "header padded to 8 bytes";
  const io::tensor_file back = io::parse_safetensors(bytes);
  EXPECT_EQ(back.metadata, f.metadata);
  ASSERT_EQ(back.tensors.size(), f.tensors.size());
  for (const auto& [name, t] : f.tensors) {
    EXPECT_EQ(back.tensors.at(name).shape, t.shape) << name;
    EXPECT_EQ(back.tensors.at(name).values, t.values) << name;
  }
}

TEST(Safetensors, ConvertsF16Bf16F64AndBool) {
  // F16: 1, -2, 2^-24 (smallest subnormal), -0, +inf, 65504 (largest finite).
  std::vector<std::byte> data;
  for (std::uint16_t h : {0x3c00, 0xc000, 0x0001, 0x8000, 0x7c00, 0x7bff}) append(data, h, 2);
  for (std::uint16_t b : {0x3f80, 0xc0a0}) append(data, b, 2);          // BF16: 1, -5
  append(data, std::bit_cast<std::uint64_t>(0.1), 8);                   // F64
  for (int b : {0, 1}) append(data, static_cast<std::uint64_t>(b), 1);  // BOOL
  const io::tensor_file f = io::parse_safetensors(
      safetensors(R"({"h":{"dtype":"F16","shape":[6],"data_offsets":[0,12]},)"
                  R"("b":{"dtype":"BF16","shape":[2],"data_offsets":[12,16]},)"
                  R"("d":{"dtype":"F64","shape":[1],"data_offsets":[16,24]},)"
                  R"("m":{"dtype":"BOOL","shape":[2],"data_offsets":[24,26]}})",
                  data));
  const std::vector<float>& h = f.tensors.at("h").values;
  EXPECT_EQ(h[0], 1.0f);
  EXPECT_EQ(h[1], -2.0f);
  EXPECT_EQ(h[2], std::ldexp(1.0f, -24));
  EXPECT_TRUE(h[3] == 0.0f && std::signbit(h[3]));
  EXPECT_EQ(h[4], std::numeric_limits<float>::infinity());
  EXPECT_EQ(h[5], 65504.0f);
  EXPECT_EQ(f.tensors.at("b").values, (std::vector<float>{1.0f, -5.0f}));
  EXPECT_EQ(f.tensors.at("d").values, (std::vector<float>{0.1f}));
  EXPECT_EQ(f.tensors.at("m").values, (std::vector<float>{0.0f, 1.0f}));
}

TEST(Safetensors, WriterRejectsInvalidTensors) {
  io::tensor_file f;
  f.tensors["w"] = {{2, 3}, std::vector<float>(5)};
  expect_error<mha::invalid_argument>([&] { io::safetensors_bytes(f); },
                                      {"'w'", "(2, 3)", "6 elements", "5 values"});
  f.tensors.clear();
  f.tensors["__metadata__"] = {{1}, {1.0f}};
  expect_error<mha::invalid_argument>([&] { io::safetensors_bytes(f); }, {"'__metadata__'"});
  expect_error<mha::invalid_argument>([&] { io::npy_bytes({{-1}, {}}); }, {"(-1)"});
  expect_error<mha::invalid_argument>(
      [&] {
        io::npy_bytes({std::vector<std::int64_t>(65, 1), {1.0f}});
      },
      {"65 dimensions"});
}

// ---- files ----

using Files = mha_test::scratch_test;

std::string contents(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

std::vector<std::filesystem::path> listing(const std::filesystem::path& dir) {
  std::vector<std::filesystem::path> names;
  for (const auto& e : std::filesystem::directory_iterator(dir)) names.push_back(e.path());
  std::sort(names.begin(), names.end());
  return names;
}

TEST_F(Files, WriteThenReadBothFormats) {
  const io::tensor t{{2, 2}, {1, 2, 3, 4}};
  io::write_npy(dir_ / "t.npy", t);
  EXPECT_EQ(io::read_npy(dir_ / "t.npy").values, t.values);
  io::write_safetensors(dir_ / "t.safetensors", {{{"t", t}}, {}});
  EXPECT_EQ(io::read_safetensors(dir_ / "t.safetensors").tensors.at("t").values, t.values);
  EXPECT_EQ(listing(dir_).size(), 2u) << "no temporary file left";
}

TEST_F(Files, MissingFileNamesThePath) {
  expect_error<mha::error>([&] { io::read_npy(dir_ / "absent.npy"); },
                           {"cannot open", "absent.npy", "No such file"});
}

TEST_F(Files, DirectoryIsNotAFile) {
  expect_error<mha::error>([&] { io::read_safetensors(dir_); },
                           {"cannot read", dir_.c_str(), "not a regular file"});
}

// A device would be read without end (never ends the read, grows memory): refused up front.
TEST_F(Files, EndlessDeviceIsRefused) {
  expect_error<mha::error>([] { io::read_npy("/dev/zero"); },
                           {"cannot read", "/dev/zero", "not a regular file"});
}

TEST_F(Files, UnwritablePathNamesIt) {
  expect_error<mha::error>(
      [&] {
        io::write_npy(dir_ / "no" / "such" / "y.npy", {{1}, {1.0f}});
      },
      {"cannot create", "y.npy"});
}

// ---- how the output is written (issue 17 D) ----

// A device (or a symlink to one) is written through, never replaced by a regular file.
TEST_F(Files, DeviceOutputStaysADevice) {
  io::write_npy("/dev/null", {{2}, {1, 2}});
  struct stat st {};
  ASSERT_EQ(::stat("/dev/null", &st), 0);
  EXPECT_TRUE(S_ISCHR(st.st_mode));
  std::filesystem::create_symlink("/dev/null", dir_ / "null");
  io::write_npy(dir_ / "null", {{2}, {1, 2}});
  EXPECT_TRUE(std::filesystem::is_symlink(dir_ / "null"));
  ASSERT_EQ(::stat("/dev/null", &st), 0);
  EXPECT_TRUE(S_ISCHR(st.st_mode));
  EXPECT_EQ(listing(dir_).size(), 1u) << "no temporary file left";
}

TEST_F(Files, FifoOutputIsWrittenThrough) {
  const std::filesystem::path fifo = dir_ / "pipe";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  std::string received;
  std::thread reader([&] { received = contents(fifo); });
  io::write_npy(fifo, {{3}, {1, 2, 3}});
  reader.join();
  EXPECT_EQ(io::parse_npy(std::as_bytes(std::span(received)), "fifo").values,
            (std::vector<float>{1, 2, 3}));
  EXPECT_TRUE(std::filesystem::is_fifo(fifo));
}

// What sits at the old fixed temporary name (<out>.partial) is neither followed nor removed.
TEST_F(Files, NothingAtTheOldTemporaryNameIsTouched) {
  {
    std::ofstream(dir_ / "victim") << "keep";
    std::ofstream(dir_ / "b.npy.partial") << "unrelated";
  }
  std::filesystem::create_symlink(dir_ / "victim", dir_ / "a.npy.partial");
  io::write_npy(dir_ / "a.npy", {{1}, {1.0f}});
  io::write_npy(dir_ / "b.npy", {{1}, {2.0f}});
  EXPECT_EQ(contents(dir_ / "victim"), "keep");
  EXPECT_TRUE(std::filesystem::is_symlink(dir_ / "a.npy.partial"));
  EXPECT_EQ(contents(dir_ / "b.npy.partial"), "unrelated");
  EXPECT_EQ(io::read_npy(dir_ / "a.npy").values, std::vector<float>{1.0f});
  EXPECT_EQ(listing(dir_).size(), 5u) << "no temporary file left";
}

TEST_F(Files, ExistingModeIsKeptNewFileFollowsTheUmask) {
  const std::filesystem::path p = dir_ / "secret.npy";
  io::write_npy(p, {{1}, {1.0f}});
  const mode_t mask = ::umask(0);
  ::umask(mask);
  struct stat st {};
  ASSERT_EQ(::stat(p.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0666u & ~mask);
  ASSERT_EQ(::chmod(p.c_str(), 0600), 0);
  io::write_npy(p, {{1}, {2.0f}});
  ASSERT_EQ(::stat(p.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  EXPECT_EQ(io::read_npy(p).values, std::vector<float>{2.0f});
}

// A symlink to a regular file: the file is replaced, the link kept.
TEST_F(Files, SymlinkToAFileKeepsTheLink) {
  io::write_npy(dir_ / "real.npy", {{1}, {1.0f}});
  std::filesystem::create_symlink("real.npy", dir_ / "link.npy");
  io::write_npy(dir_ / "link.npy", {{1}, {3.0f}});
  EXPECT_TRUE(std::filesystem::is_symlink(dir_ / "link.npy"));
  EXPECT_EQ(io::read_npy(dir_ / "real.npy").values, std::vector<float>{3.0f});
}

TEST_F(Files, NamesOfNameMaxBytesWork) {
  const std::filesystem::path p = dir_ / std::string(NAME_MAX - 4, 'n').append(".npy");
  io::write_npy(p, {{1}, {1.0f}});
  EXPECT_EQ(io::read_npy(p).values, std::vector<float>{1.0f});
}

// Two writers of the same output each leave a whole file, never a mix or an error.
TEST_F(Files, ConcurrentWritersBothProduceAValidFile) {
  const std::filesystem::path p = dir_ / "y.npy";
  const io::tensor a{{4096}, std::vector<float>(4096, 1.0f)},
      b{{4096}, std::vector<float>(4096, 2.0f)};
  std::atomic<int> errors{0};
  auto writer = [&](const io::tensor& t) {
    for (int i = 0; i < 50; ++i) {
      try {
        io::write_npy(p, t);
      } catch (const std::exception&) {
        ++errors;
      }
    }
  };
  std::thread ta(writer, std::cref(a)), tb(writer, std::cref(b));
  ta.join();
  tb.join();
  EXPECT_EQ(errors.load(), 0);
  const std::vector<float> v = io::read_npy(p).values;
  EXPECT_TRUE(v == a.values || v == b.values);
  EXPECT_EQ(listing(dir_).size(), 1u) << "no temporary file left";
}

// The header is checked before the data is read: a 2 GiB sparse file whose header is {} is
// rejected without reading (or allocating) its data (issue 17 F).
TEST_F(Files, HugeFileWithABadHeaderIsRejectedBeforeItsDataIsRead) {
  const std::filesystem::path p = dir_ / "huge.safetensors";
  {
    const std::vector<std::byte> head = safetensors("{}      ");
    std::ofstream out(p, std::ios::binary);
    out.write(reinterpret_cast<const char*>(head.data()),
              static_cast<std::streamsize>(head.size()));
  }
  std::filesystem::resize_file(p, std::uint64_t{2} << 30);  // sparse: no disk used
  struct rusage before {
  }, after{};
  ::getrusage(RUSAGE_SELF, &before);
  expect_error<mha::format_error>(
      [&] { io::read_safetensors(p); },
      {"huge.safetensors", "data section has 2147483632 bytes", "the tensors cover 0"});
  ::getrusage(RUSAGE_SELF, &after);
  EXPECT_LT(after.ru_maxrss - before.ru_maxrss, 256 * 1024) << "KiB of peak RSS added";

  // Likewise a .npy whose shape does not match its size.
  const std::filesystem::path q = dir_ / "huge.npy";
  io::write_npy(q, {{1}, {1.0f}});
  std::filesystem::resize_file(q, std::uint64_t{2} << 30);
  expect_error<mha::format_error>([&] { io::read_npy(q); },
                                  {"huge.npy", "needs 4 data bytes but the file has 2147483520"});
  ::getrusage(RUSAGE_SELF, &after);
  EXPECT_LT(after.ru_maxrss - before.ru_maxrss, 256 * 1024) << "KiB of peak RSS added";
}

// Reading some tensors reads only their bytes: a tensor not kept is never decoded (a BOOL byte
// of 2 would be an error) nor read (1 GiB of sparse zeros would show in the peak RSS).
TEST_F(Files, KeptTensorsAloneAreRead) {
  const std::filesystem::path p = dir_ / "model.safetensors";
  const std::uint64_t big = std::uint64_t{1} << 30;
  {
    const std::string header = R"({"bad":{"dtype":"BOOL","shape":[1],"data_offsets":[0,1]},)"
                               R"("big":{"dtype":"F32","shape":[268435456],"data_offsets":[5,)" +
                               std::to_string(5 + big) +
                               R"(]},"good":{"dtype":"F32","shape":[1],"data_offsets":[1,5]}})";
    std::vector<std::byte> head = safetensors(
        header, {std::byte{2}, std::byte{0}, std::byte{0}, std::byte{0x80}, std::byte{0x3f}});
    std::ofstream out(p, std::ios::binary);
    out.write(reinterpret_cast<const char*>(head.data()),
              static_cast<std::streamsize>(head.size()));
  }
  std::filesystem::resize_file(p, std::filesystem::file_size(p) + big);  // sparse
  struct rusage before {
  }, after{};
  ::getrusage(RUSAGE_SELF, &before);
  std::vector<std::string> seen;
  const io::tensor_file f = io::read_safetensors(p, [&](std::string_view name) {
    seen.emplace_back(name);
    return name == "good";
  });
  ::getrusage(RUSAGE_SELF, &after);
  EXPECT_LT(after.ru_maxrss - before.ru_maxrss, 256 * 1024) << "KiB of peak RSS added";
  std::sort(seen.begin(), seen.end());
  EXPECT_EQ(seen, (std::vector<std::string>{"bad", "big", "good"}));
  ASSERT_EQ(f.tensors.size(), 1u);
  EXPECT_EQ(f.tensors.at("good").values, std::vector<float>{1.0f});
  expect_error<mha::format_error>(
      [&] { io::read_safetensors(p, [](std::string_view name) { return name == "bad"; }); },
      {"model.safetensors", "'bad' of dtype BOOL holds a byte other than 0 or 1"});
}

TEST_F(Files, ParseErrorsNameTheFile) {
  std::filesystem::path p = dir_ / "broken.npy";
  io::write_npy(p, {{3}, {1, 2, 3}});
  std::filesystem::resize_file(p, std::filesystem::file_size(p) - 1);
  expect_error<mha::format_error>([&] { io::read_npy(p); },
                                  {"broken.npy", "needs 12 data bytes but the file has 11"});
}

}  // namespace
