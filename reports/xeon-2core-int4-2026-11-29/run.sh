#!/usr/bin/env bash
# The runs behind notes.md, on a 2-vCPU Intel Xeon VM with AMX: the int4 KV cache (4-bit keys per
# channel of each group of 64 tokens, the newest exact; k8v4's 4-bit values) beside int8 and k8v4.
# mha built by scripts/test.sh (build/test and its peers' environment); Gemma 3 270M's folder by
# scripts/gemma3-model.sh.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
out=${1:-build/int4}; mkdir -p "$out"
# Decode attention alone over each coded format (nothing else on the machine while it runs).
build/test/bench/bench_attention --benchmark_filter='decode_(int8|k8v4|int4)/' --benchmark_min_time=0.3 \
  --benchmark_repetitions=3 --benchmark_enable_random_interleaving=true \
  --benchmark_report_aggregates_only=true --benchmark_out="$out/decode.json" --benchmark_out_format=json
# The module's decode step (projections included) with each coded cache.
build/test/bench/mha_bench --preset decode --backends xsimd --formulations split_weight --batch 1 \
  --past 8192,32768 --kv-precision int8,k8v4,int4 --threads 1 --kv-heads 0 \
  --benchmark_filter='din768/dout768/h12/kv_' --benchmark_repetitions=3 \
  --benchmark_report_aggregates_only=true --benchmark_out="$out/module.json" --benchmark_out_format=json
# Accuracy on the real model over real text, against sdpa's fp32 cache.
export PYTHONPATH=tools:build/test/python PYTHONDONTWRITEBYTECODE=1
py=build/peers-venv/bin/python
scripts/gemma3-model.sh
for run in "1024 512" "4096 1024" "8192 256"; do
  set -- $run
  $py -m mhapy.model_accuracy --tokens "" --perplexity "" --caches mha_int8,mha_k8v4,mha_int4 \
    --prefill "$1" --positions "$2" --greedy-steps 0 --retrieval-tokens "$1" --threads 2 \
    --out "$out/acc-$(($1 / 1024))k.json"
done
$py -m mhapy.model_accuracy --tokens "" --perplexity "" --caches mha_int8,mha_int4 --prefill 32768 \
  --positions 256 --greedy-steps 0 --threads 2 --out "$out/acc-32k.json"
