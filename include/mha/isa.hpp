// mha: the instruction set a backend's kernels run on, as one value. backend::isa() returns
// it, result files record its name, and what a figure is read against (the FP32 FMA peak of
// its class, or the bf16 dot-product peak) follows from it here, in one place.
#pragma once

#include <cstddef>
#include <optional>
#include <string_view>

namespace mha {

// From the baseline up, x86-64's and then aarch64's. The xsimd and tbb backends have kernels for
// sse2, avx2, avx512, avx512bf16 and amx on x86-64 and for neon64 on aarch64; naive runs scalar
// loops; oneDNN reports the class of its effective ISA (its own name is in its description).
enum class isa {
  scalar,      // plain C++ loops, whatever the compiler makes of them
  sse2,        // the x86-64 baseline: 4 float lanes, no FMA
  sse41,       // oneDNN's baseline (also its "avx": no FMA)
  avx2,        // AVX2 + FMA (x86-64-v3): 8 lanes
  avx512,      // AVX-512 F/CD/DQ/BW/VL (x86-64-v4): 16 lanes
  avx512bf16,  // avx512 + AVX512_BF16: bf16 pairs multiplied by vdpbf16ps
  amx,         // avx512bf16 + AMX tiles: bf16 tile products
  neon64,      // aarch64's Advanced SIMD (NEON) with FMA, the Armv8-A baseline: 4 lanes
};

// Every isa, in the order above.
inline constexpr isa all_isas[] = {isa::scalar, isa::sse2,       isa::sse41, isa::avx2,
                                   isa::avx512, isa::avx512bf16, isa::amx,   isa::neon64};

// "scalar", "sse2", "sse41", "avx2", "avx512", "avx512bf16", "amx", "neon64": the names result
// files record and MHA_XSIMD_ISA takes.
std::string_view to_string(isa i) noexcept;

// The isa named `name` (to_string's spelling), or nullopt.
std::optional<isa> parse_isa(std::string_view name) noexcept;

// The measured FP32 FMA loop that figures of kernels on `i` are read against: "avx512" (avx512
// and up), "avx2", "neon" (neon64), or "portable" (no FMA: scalar, sse2, sse41). mha_bench
// measures these loops.
std::string_view fma_peak_of(isa i) noexcept;

// Whether kernels on `i` multiply bf16 pairs natively (avx512bf16, amx): their bf16 figures are
// read against the bf16 dot-product peak; below, and on neon64, bf16 is widened to FP32 FMAs.
constexpr bool native_bf16(isa i) noexcept { return i == isa::avx512bf16 || i == isa::amx; }

}  // namespace mha
