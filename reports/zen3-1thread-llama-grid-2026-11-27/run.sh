#!/usr/bin/env bash
# The whole Llama-3.2-1B shape (16 layers, fp32) on one thread where the cache is most of a step:
# batch 1 over 16k tokens and batch 8 over 4k, sdpa (DynamicCache, StaticCache) and mha's int8 and
# bf16 caches. From the repository root, with the test build's Python package:
# reports/zen3-1thread-llama-grid-2026-11-27/run.sh
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
export PYTHONPATH=$root/build/test/python:$root/tools
py=$root/build/peers-venv/bin/python
bench() {  # out batches prefill
  "$py" -m mhapy.models_bench --models llama1b --dtypes float32 --batches "$2" --threads 1 \
    --attention sdpa,sdpa_static,mha_int8,mha_bf16 --prefill "$3" --decode 16 --repetitions 1 \
    --between-ops 0 --logits-steps 0 --fill synthetic --out "$here/$1"
}
bench models-b8-4k.json 8 4096
bench models-b1-16k.json 1 16384
