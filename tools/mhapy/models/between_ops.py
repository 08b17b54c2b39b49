"""One decode step's attention call between two torch ops, as a model runs it: sdpa against mha
on either executor (mhapy.models.bench --between-ops). A runtime whose workers spin between
parallel regions shows here."""

from __future__ import annotations

import time


def between_ops(implementations: list[str], keys: int, iterations: int, rounds: int) -> list[dict]:
    """One decode step's attention (GPT-2's: 12 heads of 64, one query over `keys` cached keys,
    fp32) between two torch ops, as a model runs it: x @ W (768 x 768) before and after, in a
    loop of `iterations` steps per implementation, at the threads torch has, taken in `rounds`
    slices of every implementation in turn (a drift of the machine's speed meets them all
    alike). Per implementation, the median step and the median attention call alone, in ms: a
    runtime that spins between parallel regions shows here."""
    import statistics

    import torch
    import torch.nn.functional as F

    import mha

    g = torch.Generator().manual_seed(3)
    w = torch.randn(768, 768, generator=g) / 28
    start_x = torch.randn(1, 768, generator=g)
    k, v = torch.randn(1, 12, keys, 64, generator=g), torch.randn(1, 12, keys, 64, generator=g)
    threads = torch.get_num_threads()
    attend = {
        "sdpa": lambda q: F.scaled_dot_product_attention(q, k, v),
        "mha": lambda q: mha.attention(q, k, v, threads=threads),
        "mha_tbb": lambda q: mha.attention(q, k, v, threads=threads, executor="tbb"),
    }
    steps: dict[str, list[float]] = {impl: [] for impl in implementations}
    calls: dict[str, list[float]] = {impl: [] for impl in implementations}
    per_round = max(1, iterations // max(1, rounds))
    with torch.no_grad():
        for _ in range(max(1, rounds)):
            for impl in implementations:
                x = start_x
                for i in range(per_round + 10):  # the first 10 of each slice warm up
                    start = time.perf_counter()
                    q = (x @ w).view(1, 12, 1, 64)
                    before = time.perf_counter()
                    o = attend[impl](q)
                    after = time.perf_counter()
                    x = o.reshape(1, 768) @ w
                    end = time.perf_counter()
                    if i >= 10:
                        steps[impl].append(end - start)
                        calls[impl].append(after - before)
    return [
        dict(
            attention=impl,
            threads=threads,
            keys=keys,
            step_ms=1e3 * statistics.median(steps[impl]),
            attention_ms=1e3 * statistics.median(calls[impl]),
        )
        for impl in implementations
    ]
