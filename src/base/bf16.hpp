// Internal: bfloat16 (docs/design.md §1.5), the upper half of a float32's bits: 8 exponent and
// 7 stored mantissa bits. Every backend and the oracle round with to_bf16, so "rounded to bf16"
// means one thing everywhere.
#pragma once

#include <bit>
#include <cstdint>

namespace mha::detail {

using bf16 = std::uint16_t;

// f rounded to the nearest bf16, ties to even (as PyTorch's .to(torch.bfloat16) and
// vcvtne2ps2bf16 round); Inf stays Inf, NaN stays a (quiet) NaN; values past the largest bf16
// round to Inf.
// Branch-free, so loops of it vectorise.
constexpr bf16 to_bf16(float f) noexcept {
  const std::uint32_t bits = std::bit_cast<std::uint32_t>(f);
  const std::uint32_t nearest = (bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16;
  return static_cast<bf16>((bits & 0x7fffffffu) > 0x7f800000u ? (bits >> 16) | 0x40u : nearest);
}

// The float32 of the same value (exact).
constexpr float from_bf16(bf16 b) noexcept {
  return std::bit_cast<float>(static_cast<std::uint32_t>(b) << 16);
}

// f rounded to bf16, as a float32.
constexpr float round_bf16(float f) noexcept { return from_bf16(to_bf16(f)); }

}  // namespace mha::detail
