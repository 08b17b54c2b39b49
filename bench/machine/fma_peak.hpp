// FP32 FMA peak of this machine, measured: the yardstick for "% of peak" in reports. A short
// throughput loop of independent FMAs per class of instruction set (mha::fma_peak_of), on one
// core and on all cores: the loops of the SIMD kernels' own ISA rows (isa_kernels::fma_rounds and
// bf16_rounds), and a portable one. Reusable by any benchmark of bench/ (link mha_fma_peak).
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "mha/isa.hpp"

namespace mha_bench {

// The peak of one loop, named by its FMA class (mha::fma_peak_of) or, for a bf16 peak, by the
// ISA whose loop it is.
struct isa_peak {
  std::string isa;
  double gflops_one_core = 0;   // best one-thread trial (1 FMA = 2 FLOPs)
  double gflops_all_cores = 0;  // best run of fma_peak::threads threads at once
  // GFLOP/s of every one-thread trial, in the order run: the spread says how busy the machine
  // was (a quiet core repeats within a percent or two).
  std::vector<double> one_core_trials;
};

struct fma_peak {
  int threads = 1;  // threads of the all-cores figures
  // Every loop this CPU runs, widest first.
  std::vector<isa_peak> by_isa;
  // The bf16 dot-product peak (vdpbf16ps), where an ISA with native bf16 dot products runs: the
  // yardstick of bf16 kernels that use them; bf16 kernels elsewhere widen to FP32 FMAs and are
  // read against by_isa.
  std::optional<isa_peak> bf16_dot;
  // The AMX tile-product peak (TDPBF16PS on register-resident tiles), where the xsimd kernels
  // may use AMX: the yardstick of bf16 kernels on tiles.
  std::optional<isa_peak> bf16_tile;

  // The loop with the highest one-core figure.
  const isa_peak& best() const;
  // The one-core peak that bf16 kernels on `kernel_isa` are read against (bf16_peak_isa_for):
  // the tile or the dot-product peak where its bf16 is native, else the FMA loop of its class;
  // the FMA loop too where the native peak was not measured.
  double bf16_one_core(mha::isa kernel_isa) const;
  // The loop named `isa`, or best() when this CPU has none of that name.
  const isa_peak& of(std::string_view isa) const;
};

// Which measured peak the bf16 figures of kernels on `kernel_isa` are read against: "bf16_tile"
// (fma_peak::bf16_tile) for AMX's tiles, "bf16_dot" (fma_peak::bf16_dot) for the other ISAs with
// native bf16 (mha::native_bf16: vdpbf16ps), else the FP32 loop mha::fma_peak_of names (the
// kernels widen bf16 to FP32 FMAs). fp32 figures: mha::fma_peak_of.
std::string_view bf16_peak_isa_for(mha::isa kernel_isa);

// Measures every loop this CPU runs (and the bf16 loops where they run): `trials` one-thread runs
// of about 25 ms each, then the best of 3 runs of `threads` (>= 1) threads at once (not pinned).
// Loops: per FMA class, the best runnable kernel ISA's of that class (so x86-64-v4's and
// x86-64-v3's where the CPU has them, NEON's fmla on aarch64), and a portable 4-lane loop (mul +
// add where there is no FMA hardware). About 0.1 s per loop and 8 trials. The best of several
// trials makes it robust to other load, not immune: the trials are kept so reports can say.
fma_peak measure_fma_peak(int threads, int trials = 8);

// `trials` one-thread runs of loop `isa` (a name of measure_fma_peak's loops), GFLOP/s each:
// a re-measurement during a long run, to catch a start-up calibration on a busy machine.
std::vector<double> fma_trials_one_core(std::string_view isa, int trials);

}  // namespace mha_bench
