#!/usr/bin/env bash
# The runs behind notes.md, on a 2-vCPU Intel Xeon VM with AMX: KV cache formats simulated in
# PyTorch (mhapy.simulated_caches: keys and values rounded to a format's codes and back as they
# enter a DynamicCache, attention by sdpa) on Gemma 3 270M's real weights over Debian's licences,
# judged by mhapy.model_accuracy against sdpa with its fp32 cache, beside mha's real int8 cache.
# mha built by scripts/test.sh (build/test and its peers' environment).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
export PYTHONPATH=tools:build/test/python PYTHONDONTWRITEBYTECODE=1
out=${1:-build/cache-formats}; mkdir -p "$out"
py=build/peers-venv/bin/python
scripts/gemma3-model.sh
formats=$($py -c 'from mhapy.simulated_caches import FORMATS; print(",".join(FORMATS))')
$py -m mhapy.model_accuracy --tokens "" --perplexity "" --caches "mha_int8,$formats" --prefill 4096 \
  --positions 256 --greedy-steps 0 --threads 2 --out "$out/formats-4k.json"
$py -m mhapy.model_accuracy --tokens "" --perplexity "" \
  --caches mha_int8,sim_int8,sim_k8v4g32,sim_k8v4g16,sim_int4_channel_v4g32,sim_int4_channel_v4g16,sim_int4_hadamard \
  --prefill 8192 --positions 256 --greedy-steps 0 --threads 2 --out "$out/formats-8k.json"

$py -m mhapy.model_accuracy --tokens "" --perplexity "" --caches sim_k8v4g16,sim_k8v4h,sim_k8v4hg64,sim_k8v4hg32 \
  --prefill 4096 --positions 256 --greedy-steps 0 --threads 2 --out "$out/formats-turned-4k.json"
