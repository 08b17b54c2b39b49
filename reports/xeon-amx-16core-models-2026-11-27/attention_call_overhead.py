"""One decode attention call (B1, 12 heads of 64, fp32) in a loop, at 16 and 2 threads: sdpa,
mha on PyTorch's pool, mha serial, mha on oneTBB; 16 keys (the call's fixed cost) and 1,152
(GPT-2's decode). Best of 3 loops of 2,000 calls, in us. Wrote attention-call-overhead.txt:
PYTHONPATH=<mha's package> python attention_call_overhead.py"""

import time

import torch

import mha

sdpa = torch.nn.functional.scaled_dot_product_attention


def per_call_us(f, calls=2000):
    for _ in range(200):
        f()
    begin = time.perf_counter()
    for _ in range(calls):
        f()
    return (time.perf_counter() - begin) / calls * 1e6


for threads in (16, 2):
    torch.set_num_threads(threads)
    for keys in (16, 1152):
        q = torch.randn(1, 12, 1, 64)
        k, v = torch.randn(1, 12, keys, 64), torch.randn(1, 12, keys, 64)
        calls = {
            "sdpa": lambda: sdpa(q, k, v),
            "mha": lambda: mha.attention(q, k, v),
            "mha_serial": lambda: mha.attention(q, k, v, executor="serial"),
            "mha_tbb": lambda: mha.attention(q, k, v, executor="tbb", threads=threads),
        }
        best = {name: min(per_call_us(f) for _ in range(3)) for name, f in calls.items()}
        said = ", ".join(f"{name} {us:.1f} us" for name, us in best.items())
        print(threads, "threads", keys, "keys:", said, flush=True)
