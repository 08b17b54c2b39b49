#!/usr/bin/env bash
# The runs behind notes.md, on a 2-vCPU Intel Xeon VM with AMX: speculative decoding's
# verification step (T new tokens per sequence over a KV cache) in mha's kernels, in the module
# beside PyTorch's SDPA, and transformers' prompt-lookup decoding on Gemma 3 270M's real weights.
# mha built by scripts/test.sh (build/test and its peers' environment); Gemma 3 270M's folder by
# scripts/gemma3-model.sh. Nothing else on the machine while it runs.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
out=${1:-build/verify}; mkdir -p "$out"
# bench_attention's steps matching $1 before (the binary $2: bench_attention built at the commit
# before the change) and after it, interleaved, three rounds, each $3 seconds at least, into
# $out/$4-<before|after>-<round>.json.
before_after() {
  for round in 1 2 3; do
    for v in before after; do
      bench=build/test/bench/bench_attention; [[ $v == before ]] && bench=$2
      "$bench" --benchmark_filter="$1" --benchmark_min_time="$3" \
        --benchmark_out="$out/$4-$v-$round.json" --benchmark_out_format=json
    done
  done
}
# The kernel alone: T = 1 and 8 over 8k and 32k, B1 and B8, every cache format, before and after
# the panels were read ahead.
before_after 'decode_(fp32|bf16|int8|k8v4|int4)/b(1/t(1|8)/past(8192|32768)|8/t(1|8)/past8192)/' \
  "${BENCH_BEFORE:-/tmp/bench_before}" 0.2 kernel
# The one-token step (T = 1) before and after a single bf16 or int8 row read its panels ahead.
before_after 'decode_(fp32|bf16|int8)/b(1/t1/past(8192|32768|131072)|32/t1/past2048)/' \
  "${BENCH_SINGLE_BEFORE:-/tmp/bench_single_before}" 0.3 single-row
# The module's verification steps (the decode preset's decode_verify series, tbb, split-weight)
# and PyTorch's SDPA on the same shapes (its explicit bottom-right mask), then the report.
steps='/b(1/t[0-9]+/past(2048|8192|32768)|8/t[0-9]+/past8192)/din768/dout768/h12/(bf16/)?(kv_[a-z0-9]+/)?threads'
verify() { build/test/bench/mha_bench --preset decode --backends tbb --formulations split_weight \
  --benchmark_filter="$steps" "$@"; }
# (inputs/verify.json.gz came from a looser filter, which also took the decode_kv series' grouped
# heads at those lengths: the report's grouped-query section.)
verify --benchmark_min_time=0.2 --benchmark_out="$out/verify.json" --benchmark_out_format=json
verify --dump-shapes "$out/shapes.json"
export PYTHONPATH=tools:build/test/python PYTHONDONTWRITEBYTECODE=1
py=build/peers-venv/bin/python
# PyTorch keeps its cache in the module's precision: the coded caches' shapes are mha's alone;
# and not over 32k (the peers' float64 check of a 32k step takes 1.5 minutes a shape here).
$py -c 'import json, sys; s = json.load(open(sys.argv[1])); json.dump([x for x in s if "/kv_" not in x["name"] and x["past"] < 32768], open(sys.argv[2], "w"))' \
  "$out/shapes.json" "$out/shapes-peers.json"
$py -m mhapy.peers --libraries pytorch --variants torch_sdpa --shapes "$out/shapes-peers.json" --repetitions 1 \
  --out "$out/verify-peers.json"
PYTHONPATH=tools /usr/bin/python3 -m mhapy.report "$out/verify.json" "$out/verify-peers.json" --out "$out/report"
# Gemma 3 270M: greedy, prompt lookup and a 6-layer self-draft through sdpa's DynamicCache, mha's
# and the int8 MhaCache (three rounds), then the other formats (one round).
scripts/gemma3-model.sh
$py -m mhapy.speculative --prompt-tokens 1024 --new-tokens 128 --caches sdpa,mha,mha_int8 \
  --ways greedy,lookup,assisted --draft-layers 6 --rounds 3 --threads 2 --out "$out/speculative.json"
$py -m mhapy.speculative --prompt-tokens 1024 --new-tokens 128 \
  --caches mha_fp32,mha_bf16,mha_k8v4,mha_int4 --ways greedy,lookup --rounds 1 --threads 2 \
  --out "$out/speculative-formats.json"
