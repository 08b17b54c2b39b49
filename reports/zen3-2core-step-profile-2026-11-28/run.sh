#!/usr/bin/env bash
# Where a GPT-2 small decode step's time goes (models_bench --profile-steps): B1, 1,024 cached
# tokens, mha against sdpa, fp32 on 2 and 1 threads; fp32 on 2 threads with the caches (sdpa's
# StaticCache, mha's bf16 MhaCache) twice; bf16 weights on 2 and 1 threads, the cache filled
# synthetically (a bf16 prefill of 1,024 tokens takes minutes on AVX2); then, with mha's own fp32
# cache (mha_fp32, at 04ec4ef), fp32 on 2 threads twice. Needs the peers'
# environment (scripts/peers-env.sh). From the repository root, with the test build's Python package:
# reports/zen3-2core-step-profile-2026-11-28/run.sh
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
export PYTHONPATH=$root/build/test/python:$root/tools
bench() { "$root/build/peers-venv/bin/python" -m mhapy.models_bench --models gpt2 --batches 1 \
  --prefill 1024 --between-ops 0 --logits-steps 0 "$@"; }
bench --dtypes float32 --threads 2,1 --attention sdpa,mha --decode 64 --repetitions 3 \
  --profile-steps 16 --out "$here/gpt2-fp32-threads.json"
for round in 1 2; do
  bench --dtypes float32 --threads 2 --attention sdpa,sdpa_static,mha,mha_bf16 --decode 64 \
    --repetitions 5 --profile-steps 16 --out "$here/gpt2-fp32-2t-caches-$round.json"
done
bench --dtypes bfloat16 --threads 2,1 --attention sdpa,mha --decode 24 --repetitions 3 \
  --profile-steps 8 --fill synthetic --out "$here/gpt2-bf16-synthetic.json"
for round in 1 2; do
  bench --dtypes float32 --threads 2 --attention sdpa,sdpa_static,mha,mha_fp32,mha_bf16 --decode 64 \
    --repetitions 5 --logits-steps 16 --profile-steps 16 --out "$here/gpt2-fp32-2t-own-cache-$round.json"
done
