#!/usr/bin/env bash
# The Llama-3.2-1B shape at batch 8 over 16,384 cached tokens, its first 4 of 16 layers (sdpa's fp32
# DynamicCache of 16 layers at this shape, 8.6 GB, and its copies pass this VM's memory; a layer's
# step is the same whatever the count), fp32 and bf16 on 2 threads, fp32 on 1: sdpa (DynamicCache,
# StaticCache) and mha's int8 and bf16 caches, every cache filled synthetically.
# From the repository root, with the test build's Python package:
# reports/zen3-2core-llama-b8-16k-2026-11-27/run.sh
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
export PYTHONPATH=$root/build/test/python:$root/tools
py=$root/build/peers-venv/bin/python
bench() {  # out dtype threads
  "$py" -m mhapy.models_bench --models llama1b --layers 4 --dtypes "$2" --batches 8 --threads "$3" \
    --attention sdpa,sdpa_static,mha_int8,mha_bf16 --prefill 16384 --decode 16 --repetitions 1 \
    --between-ops 0 --logits-steps 16 --fill synthetic --out "$here/$1"
}
bench models-fp32.json float32 2
bench models-bf16.json bfloat16 2
bench models-fp32-1thread.json float32 1
