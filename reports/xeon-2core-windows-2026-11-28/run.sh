#!/usr/bin/env bash
# The runs behind notes.md: the window preset (sliding windows of 512 and 4,096 beside causal
# attention, GPT-2 small's width, prefill of 4k-32k tokens and a decode step over as many) on mha's
# tbb and xsimd backends (split_weight), PyTorch's SDPA (its masked call) and ONNX Runtime's
# GroupQueryAttention (local_window_size) at the same shapes, then the report. A 2-vCPU Intel Xeon
# VM with AMX (AVX-512), mha built by scripts/test.sh (build/test and its peers' environment).
# The peers time the windowed shapes only (the section reads each peer at the windowed shape; the
# causal twins' peers include the seeds' modules, whose (B, H, T, T) scores took 12.9 GB at 16k
# and were killed). ONNX Runtime's GQA keeps a (B, H, T, keys) fp32 buffer of probabilities
# (51 GB at T 32k), so its forward passes stop at 8k (its decode steps run at every length).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root"
out=${1:-build/windows-sweep}
mkdir -p "$out"
export PYTHONPATH=tools:build/test/python
bench=(build/test/bench/mha_bench --preset window --backends tbb,xsimd --formulations split_weight)
"${bench[@]}" --budget 0 --benchmark_repetitions=3 --benchmark_out="$out/mha.json" \
  --benchmark_out_format=json
"${bench[@]}" --benchmark_filter='/w[0-9]+/' --dump-shapes "$out/shapes.json"
"${bench[@]}" --benchmark_filter='/t(1/past[0-9]+|4096|8192)/.*/w[0-9]+/' \
  --dump-shapes "$out/shapes-onnxruntime.json"
peers() { build/peers-venv/bin/python -m mhapy.peers --repetitions 3 "$@"; }
peers --libraries pytorch --shapes "$out/shapes.json" --out "$out/peers-pytorch.json"
peers --libraries onnxruntime --shapes "$out/shapes-onnxruntime.json" --out "$out/peers-onnxruntime.json"
/usr/bin/python3 -m mhapy.report "$out"/mha.json "$out"/peers-*.json --out "$out/report"
