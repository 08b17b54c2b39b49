// Internal to mha_bench_context: what the machine context says about the CPU, per architecture
// (machine_cpu_<arch>.cpp, the one bench/CMakeLists.txt builds for the target), and the
// /proc/cpuinfo reader they share (machine_context.cpp).
#pragma once

#include <string>
#include <string_view>

namespace mha_bench {

// The value of the first /proc/cpuinfo line whose key is `key` ("model name", "CPU part"), or ""
// when there is none.
std::string cpuinfo_value(std::string_view key);

// The extensions that decide which kernels a backend can use, space-separated ("avx2 fma
// avx512f ..." on x86-64, "asimd asimddp sve bf16 ..." on aarch64), or "unknown".
std::string cpu_features();

// "" when the code runs on the CPU it was built for; else what runs it: MHA_EMULATION when set
// (scripts/test-aarch64.sh sets it), or what gave the emulator away (an aarch64 build whose
// /proc/cpuinfo describes an x86 CPU: qemu-user shows the host's).
std::string cpu_emulation();

}  // namespace mha_bench
