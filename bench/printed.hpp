// A number as printf's `format` writes it ("%.1f", "%g"): the benchmarks' context values and
// messages. (Header-only: mha_sweep, the machine context and mha_bench all print numbers.)
#pragma once

#include <cstdio>
#include <string>

namespace mha_bench {

inline std::string printed(const char* format, double value) {
  char buffer[64];
  std::snprintf(buffer, sizeof buffer, format, value);
  return buffer;
}

}  // namespace mha_bench
