#!/usr/bin/env bash
# The whole Llama-3.2-1B shape (16 layers) with bf16 weights over the context grid at batch 1 and 8,
# 2 threads (and batch 1 over 16k on one): sdpa (DynamicCache, StaticCache) and mha's int8 and bf16
# caches, every cache filled synthetically (a bf16 prefill of thousands of tokens takes minutes a
# layer on this AVX2 VM).
# From the repository root, with the test build's Python package:
# reports/zen3-2core-llama-bf16-2026-11-27/run.sh
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
export PYTHONPATH=$root/build/test/python:$root/tools
py=$root/build/peers-venv/bin/python
bench() {  # out batches tokens [threads]
  "$py" -m mhapy.models_bench --models llama1b --dtypes bfloat16 --batches "$2" --threads "${4:-2}" \
    --attention sdpa,sdpa_static,mha_int8,mha_bf16 --prefill "$3" --decode 16 --repetitions 1 \
    --between-ops 0 --logits-steps 16 --fill synthetic --out "$here/$1"
}
bench models-b1-4k.json 1 4096
bench models-b8-4k.json 8 4096
bench models-b1-16k.json 1 16384
bench models-b1-16k-1thread.json 1 16384 1
