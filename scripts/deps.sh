#!/usr/bin/env bash
# Installs, with apt-get, the Debian 12 packages mha needs that this machine lacks.
# Idempotent: prints what is present and installs only what is missing. Run as root or with sudo.
#   scripts/deps.sh              the project's packages (below)
#   scripts/deps.sh PACKAGE...   just these (optional extras, e.g. libopenblas0-openmp)
set -euo pipefail

packages=(
  cmake g++ make ninja-build pkg-config ccache             # build
  nlohmann-json3-dev                                       # safetensors headers (io)
  libxsimd-dev libdnnl-dev ocl-icd-opencl-dev libtbb-dev   # optional backends (dnnl needs OpenCL)
  libgtest-dev libgmock-dev                                # tests
  clang-14 libclang-rt-14-dev                              # fuzz targets (libFuzzer, sanitizers)
  clang-format-14                                          # the formatting check (scripts/format.sh)
  libbenchmark-dev libbenchmark-tools                      # benchmarks, compare.py
  python3-numpy python3-matplotlib python3-pytest python3-scipy  # reports and their tests
  python3-dev                                              # the Python package's extension
)
if (($#)); then packages=("$@"); fi

missing=()
for p in "${packages[@]}"; do
  if [[ "$(dpkg-query -W -f='${db:Status-Status}' "$p" 2>/dev/null)" != "installed" ]]; then
    missing+=("$p")
  fi
done

if ((${#missing[@]} == 0)); then
  echo "deps: all ${#packages[@]} packages present"
  exit 0
fi

sudo=()
if [[ "$(id -u)" -ne 0 ]]; then sudo=(sudo); fi
echo "deps: installing ${missing[*]}"
"${sudo[@]}" apt-get update -qq
DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
