#!/usr/bin/env bash
# The Llama-3.2-1B shape with all 16 layers, fp32, batch 1, a real prefill of 4,096 tokens, then
# 16 greedy decode steps, on one thread: sdpa (DynamicCache, StaticCache), mha's int8 and bf16
# caches, and OpenVINO through optimum-intel (its default KV precision, and u8). Needs the peers'
# environment and optimum's (scripts/peers-env.sh; scripts/peers-env.sh optimum). From the
# repository root, with the test build's Python package:
# reports/zen3-1thread-llama16-openvino-2026-11-28/run.sh
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
export PYTHONPATH=$root/build/test/python:$root/tools
"$root/build/peers-venv/bin/python" -m mhapy.models_bench --models llama1b --dtypes float32 \
  --batches 1 --threads 1 --attention sdpa,sdpa_static,mha_int8,mha_bf16,openvino,openvino_u8 \
  --prefill 4096 --decode 16 --repetitions 1 --between-ops 0 --logits-steps 8 \
  --out "$here/models-llama16-4k-1thread.json"
