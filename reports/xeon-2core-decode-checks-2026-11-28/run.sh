#!/usr/bin/env bash
# The runs behind notes.md, on a 2-vCPU Intel Xeon VM with AMX: (1) the decode step inside
# Gemma 3 270M's shape (random weights, fp32) at 8k,
# (2) int8 / fp32 decode step ratios, (3) GPT-2's bf16 decode profile at 1 and 2 threads.
# mha built by scripts/test.sh (build/test and its peers' environment).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
export PYTHONPATH=tools:build/test/python PYTHONDONTWRITEBYTECODE=1
out=${1:-build/xeon-measure}; mkdir -p "$out"
py=build/peers-venv/bin/python
build/test/bench/mha_bench --preset decode --backends tbb --formulations split_weight --threads 1 \
  --precision fp32 --kv-precision fp32,int8 \
  --benchmark_filter='/(b1/t1/past8192|b32/t1/past2048|b1/t1/past131072)/' \
  --benchmark_repetitions=5 --budget 0 --benchmark_out="$out/decode-int8.json" --benchmark_out_format=json --quiet > "$out/decode-int8.txt" 2>&1
bench() { $py -m mhapy.models_bench --models gemma3 --dtypes float32 --batches 1 --between-ops 0 --logits-steps 0 "$@"; }
bench --threads 2 --attention sdpa,mha_int8 --prefill 8192 --decode 16 --repetitions 2 --out "$out/models-8k-2t.json" > "$out/models-8k-2t.txt" 2>&1
bench --threads 1 --attention sdpa,mha_int8 --prefill 8192 --decode 16 --repetitions 2 --out "$out/models-8k-1t.json" > "$out/models-8k-1t.txt" 2>&1
$py -m mhapy.models_bench --models gpt2 --dtypes bfloat16,float32 --batches 1 --threads 1,2 \
  --attention sdpa,mha --prefill 1024 --decode 128 --repetitions 5 --profile-steps 16 \
  --between-ops 0 --logits-steps 0 --out "$out/gpt2-profile.json" > "$out/gpt2-profile.txt" 2>&1
# Gemma 3 270M's real weights (scripts/gemma3-model.sh makes the folder) over real text: perplexity
# over 8,192 tokens on sdpa and mha, the int8 MhaCache's KL against sdpa's fp32 cache over 256
# positions after an 8,192-token prefill; perplexity over 32,768 tokens on mha and on sdpa, one run
# each (sdpa's took 481 s: its fifteen sliding layers masked over every key).
scripts/gemma3-model.sh
$py -m mhapy.model_accuracy --tokens 8192 --perplexity sdpa,mha --caches sdpa,mha_int8 --prefill 8192 \
  --positions 256 --greedy-steps 0 --threads 2 --out "$out/accuracy-8k.json"
for attention in mha sdpa; do
  $py -m mhapy.model_accuracy --tokens 32768 --perplexity $attention --caches "" --positions 0 \
    --greedy-steps 0 --threads 2 --out "$out/accuracy-32k-$attention.json"
done
