#include "mha/isa.hpp"

#include <array>
#include <iterator>

namespace mha {
namespace {

// One name per isa, in the enum's order: the only table of ISA names in mha.
constexpr std::array<std::string_view, 8> names = {"scalar", "sse2",       "sse41", "avx2",
                                                   "avx512", "avx512bf16", "amx",   "neon64"};
static_assert(names.size() == std::size(all_isas), "every isa has one name");
static_assert(static_cast<std::size_t>(isa::neon64) + 1 == names.size(),
              "all_isas ends with neon64");

}  // namespace

std::string_view to_string(isa i) noexcept {
  const auto index = static_cast<std::size_t>(i);
  return index < names.size() ? names[index] : "unknown";
}

std::optional<isa> parse_isa(std::string_view name) noexcept {
  for (isa i : all_isas) {
    if (to_string(i) == name) return i;
  }
  return std::nullopt;
}

std::string_view fma_peak_of(isa i) noexcept {
  switch (i) {
    case isa::avx512:
    case isa::avx512bf16:
    case isa::amx:
      return "avx512";
    case isa::avx2:
      return "avx2";
    case isa::neon64:
      return "neon";
    case isa::scalar:
    case isa::sse2:
    case isa::sse41:
      break;
  }
  return "portable";
}

}  // namespace mha
