import time, statistics, torch, mha
from mha import _attention as A
import torch.nn.functional as F
real = A._mha._attention_tensors
def alone(f, calls=2000):
    for _ in range(200): f()
    b = time.perf_counter()
    for _ in range(calls): f()
    return (time.perf_counter() - b) / calls * 1e6
for threads in (1, 2):
    torch.set_num_threads(threads)
    for keys in (16, 1152):
        q = torch.randn(1, 12, 1, 64).bfloat16(); k = torch.randn(1, 12, keys, 64).bfloat16(); v = torch.randn(1, 12, keys, 64).bfloat16()
        res = {"sdpa": [], "mha_cpp": [], "mha_general": []}
        for r in range(5):
            for name in res:
                A._mha._attention_tensors = real if name != "mha_general" else (lambda *a: None)
                f = (lambda: F.scaled_dot_product_attention(q, k, v)) if name == "sdpa" else (lambda: mha.attention(q, k, v))
                res[name].append(alone(f))
        print(f"bf16 {threads}t {keys:5d} keys: " + ", ".join(f"{n} {statistics.median(x):.1f}" for n, x in res.items()), flush=True)
