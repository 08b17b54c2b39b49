// mha: the instruction set a backend's kernels run on, as one value. backend::isa() returns
// it, result files record its name, and what a figure is read against (the FP32 FMA peak of
// its class, or the bf16 dot-product peak) follows from it, all from one list of rows,
// mha/isas.def.
#pragma once

#include <cstddef>
#include <optional>
#include <string_view>

namespace mha {

// The rows of mha/isas.def in order: x86-64's from the baseline up, then aarch64's. The xsimd
// and tbb backends have kernels for the ISAs of src/kernels/arch/<arch>/kernel_isas.def; naive
// runs scalar loops; oneDNN reports the class of its effective ISA (its own name is in its
// description).
enum class isa {
#define MHA_ISA(name, fma_peak, native_bf16) name,
#include "mha/isas.def"
#undef MHA_ISA
};

// Every isa, in the order above.
inline constexpr isa all_isas[] = {
#define MHA_ISA(name, fma_peak, native_bf16) isa::name,
#include "mha/isas.def"
#undef MHA_ISA
};

// The isa's row name ("scalar", "avx2", ...): the name result files record and MHA_XSIMD_ISA
// takes; "unknown" for a value outside the enum.
std::string_view to_string(isa i) noexcept;

// The isa named `name` (to_string's spelling), or nullopt.
std::optional<isa> parse_isa(std::string_view name) noexcept;

// The measured FP32 FMA loop that figures of kernels on `i` are read against (its row's
// fma_peak: "portable" where there is no FMA). mha_bench measures these loops.
std::string_view fma_peak_of(isa i) noexcept;

// Whether kernels on `i` multiply bf16 pairs natively (its row's native_bf16): their bf16 figures
// are read against the bf16 product peak; elsewhere bf16 is widened to FP32 FMAs.
constexpr bool native_bf16(isa i) noexcept {
  switch (i) {
#define MHA_ISA(name, fma_peak, native) \
  case isa::name:                       \
    return native;
#include "mha/isas.def"
#undef MHA_ISA
  }
  return false;
}

}  // namespace mha
