// The test suite's own rules, checked over every test the executable registered.
#include <gtest/gtest.h>

#include <string>
#include <string_view>

namespace {

// Every parameterised test's parameter prints by name (a PrintTo, tests/support.hpp), not as
// gtest's "N-byte object <...>": gtest formats such bytes for every parameterised test when a
// process starts, and ctest starts one process per test.
TEST(TestSupport, EveryParameterPrintsByName) {
  const testing::UnitTest& unit = *testing::UnitTest::GetInstance();
  int parameterised = 0, printed_as_bytes = 0;
  std::string first;  // the first few, for the message
  for (int s = 0; s < unit.total_test_suite_count(); ++s) {
    const testing::TestSuite& suite = *unit.GetTestSuite(s);
    for (int t = 0; t < suite.total_test_count(); ++t) {
      const testing::TestInfo& test = *suite.GetTestInfo(t);
      if (test.value_param() == nullptr) continue;
      ++parameterised;
      if (std::string_view(test.value_param()).find("-byte object <") == std::string_view::npos) {
        continue;
      }
      if (++printed_as_bytes <= 3) {
        first += "\n  " + std::string(suite.name()) + "." + test.name() + ": " + test.value_param();
      }
    }
  }
  EXPECT_GT(parameterised, 1000) << "the executable registers the conformance suites";
  EXPECT_EQ(printed_as_bytes, 0) << "parameters printed as bytes, first:" << first;
}

}  // namespace
