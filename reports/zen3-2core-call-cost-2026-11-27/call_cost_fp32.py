"""A/B of mha.attention's plain call read in C++ (A: on, B: off = the general path, NumPy views), one decode call between two torch ops (mhapy.between_ops's loop) and alone; Zen3."""
import sys, time, statistics, torch
import mha
from mha import _attention as A
from mhapy.between_ops import between_ops
import torch.nn.functional as F
real = A._mha._attention_tensors
def set_plain(on): A._mha._attention_tensors = real if on else (lambda *a: None)
def alone(impl, keys, calls=2000):
    q = torch.randn(1, 12, 1, 64); k = torch.randn(1, 12, keys, 64); v = torch.randn(1, 12, keys, 64)
    f = (lambda: F.scaled_dot_product_attention(q, k, v)) if impl == "sdpa" else (lambda: mha.attention(q, k, v))
    for _ in range(200): f()
    b = time.perf_counter()
    for _ in range(calls): f()
    return (time.perf_counter() - b) / calls * 1e6
for threads in (1, 2):
    torch.set_num_threads(threads)
    for keys in (16, 1152):
        res = {"sdpa": [], "mha_cpp": [], "mha_general": []}
        btw = {"sdpa": [], "mha_cpp": [], "mha_general": []}
        for r in range(5):
            for name in res:
                set_plain(name != "mha_general")
                impl = "sdpa" if name == "sdpa" else "mha"
                res[name].append(alone(impl, keys))
                btw[name].append(1e3 * between_ops([impl], keys, 400, 1)[0]["attention_ms"])
        print(f"{threads}t {keys:5d} keys alone (median of 5, us): " + ", ".join(f"{n} {statistics.median(x):.1f}" for n, x in res.items())
              + " | between ops: " + ", ".join(f"{n} {statistics.median(x):.1f}" for n, x in btw.items()), flush=True)
