#include "mha/isa.hpp"

#include <iterator>

namespace mha {
namespace {

// Each isa's row of mha/isas.def, in the enum's order.
struct row {
  std::string_view name, fma_peak;
};
constexpr row rows[] = {
#define MHA_ISA(name, fma_peak, native_bf16) {#name, fma_peak},
#include "mha/isas.def"
#undef MHA_ISA
};
static_assert(std::size(rows) == std::size(all_isas), "every isa has one row");

const row* row_of(isa i) noexcept {
  const auto index = static_cast<std::size_t>(i);
  return index < std::size(rows) ? &rows[index] : nullptr;
}

}  // namespace

std::string_view to_string(isa i) noexcept {
  const row* r = row_of(i);
  return r != nullptr ? r->name : "unknown";
}

std::optional<isa> parse_isa(std::string_view name) noexcept {
  for (isa i : all_isas) {
    if (to_string(i) == name) return i;
  }
  return std::nullopt;
}

std::string_view fma_peak_of(isa i) noexcept {
  const row* r = row_of(i);
  return r != nullptr ? r->fma_peak : "portable";
}

}  // namespace mha
