# Device experiment: the OpenMP executor's variants (MHA_OMP_VARIANT, experiment build only):
# 0 today's dynamic,1 on a team of `threads`; 1 dynamic,1 on min(threads, tasks); 2 contiguous
# static chunks on min(threads, tasks). One call alone, then GPT-2 decode in transformers.
import os, sys, time, statistics, json, torch, mha, mha.transformers
from mhapy import models_bench as mb
F = torch.nn.functional.scaled_dot_product_attention
out = sys.argv[1]
res = {"calls": [], "models": []}
def t(f, n):
    for _ in range(100): f()
    s = time.perf_counter()
    for _ in range(n): f()
    return (time.perf_counter() - s) / n * 1e6
def variant(v):
    os.environ["MHA_OMP_VARIANT"] = str(v)
for threads in (16, 2):
    torch.set_num_threads(threads)
    for keys in (16, 1152):
        q = torch.randn(1, 12, 1, 64); k = torch.randn(1, 12, keys, 64); v = torch.randn(1, 12, keys, 64)
        fs = [("sdpa", None, lambda: F(q, k, v))] + [(f"mha_v{x}", x, lambda: mha.attention(q, k, v)) for x in (0, 1, 2)]
        got = {name: [] for name, _, _ in fs}
        n = 1500 if keys == 16 else 500
        for _ in range(5):
            for name, x, f in fs:
                if x is not None: variant(x)
                got[name].append(t(f, n))
        row = {name: statistics.median(v) for name, v in got.items()}
        res["calls"].append(dict(threads=threads, keys=keys, **row))
        print(threads, "threads", keys, "keys:", ", ".join(f"{n} {us:.1f}" for n, us in row.items()), flush=True)
json.dump(res, open(out, "w"), indent=1)
plan = [(torch.float32, 16, 5), (torch.bfloat16, 16, 5), (torch.float32, 2, 3), (torch.bfloat16, 2, 3)]
for dtype, threads, rounds in plan:
    torch.set_num_threads(threads)
    model = mb.build("gpt2", dtype)
    impls = [("sdpa", "sdpa", None), ("mha_v0", "mha", 0), ("mha_v1", "mha", 1), ("mha_v2", "mha", 2)]
    got = {name: [] for name, _, _ in impls}
    for r in range(rounds):
        for name, impl, x in impls:
            if x is not None: variant(x)
            got[name].append(mb.measure(model, impl, 1, 1024, 64, "prefill"))
    for name, rs in got.items():
        row = {key: statistics.median(r[key] for r in rs) for key in ("decode_tokens_per_s", "decode_attention_ms", "ttft_s")}
        row["decode_tokens_per_s_all"] = [round(r["decode_tokens_per_s"], 2) for r in rs]
        res["models"].append(dict(dtype=str(dtype), threads=threads, impl=name, **row))
        print(dtype, threads, name, {k: (round(v, 4) if isinstance(v, float) else v) for k, v in row.items()}, flush=True)
    json.dump(res, open(out, "w"), indent=1)
