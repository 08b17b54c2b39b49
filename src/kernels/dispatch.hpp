// Internal: how the ISA-neutral code reaches the per-ISA kernel tables through xsimd::dispatch.
#pragma once

#include <xsimd/xsimd.hpp>

#include "kernels/isa_kernels.hpp"

namespace mha::detail {

// The archs with a kernel table, best first (xsimd::dispatch requires that order). The AVX2
// kernels need FMA, hence fma3<avx2>; AVX-512 uses avx512bw because xsimd 8.1 needs AVX512DQ/BW
// intrinsics for hadd and its avx512cd alias (docs/dependencies.md §1.1).
using kernel_archs = xsimd::arch_list<xsimd::avx512bw, xsimd::fma3<xsimd::avx2>, xsimd::sse2>;

// xsimd::dispatch's functor: the isa_kernels compiled for Arch. Each specialization is defined
// in the translation unit compiled for its arch (micro/kernels_avx512.cpp, ...).
struct kernel_table {
  template <class Arch>
  const isa_kernels* operator()(Arch) const noexcept;
};
template <>
const isa_kernels* kernel_table::operator()(xsimd::avx512bw) const noexcept;
template <>
const isa_kernels* kernel_table::operator()(xsimd::fma3<xsimd::avx2>) const noexcept;
template <>
const isa_kernels* kernel_table::operator()(xsimd::sse2) const noexcept;

// The AVX-512 kernels with AVX512_BF16 (micro/kernels_avx512bf16.cpp): xsimd 8.1 has no arch
// for it, so it is reached by name rather than through xsimd::dispatch.
const isa_kernels* avx512bf16_kernels() noexcept;
// The AVX512_BF16 kernels with the bf16 GEMM on AMX tiles (micro/kernels_amx.cpp), by name too.
const isa_kernels* amx_kernels() noexcept;

}  // namespace mha::detail
