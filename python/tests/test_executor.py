"""Who runs the tbb backend's parallel work from Python (mha._executor, docs/python.md "Threads"):
every executor gives the same bits; inside PyTorch the automatic choice is PyTorch's own OpenMP
pool (no thread of mha's own starts), or oneTBB with the reason where mha cannot share it."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import mha
from mha import _executor, _mha

torch = pytest.importorskip("torch")
import mha.torch  # noqa: E402

pytestmark = pytest.mark.skipif(
    "tbb" not in {b.name for b in mha.backends()}, reason="the tbb backend is not built"
)

F = torch.nn.functional
EXECUTORS = ["tbb", "serial"] + (["openmp"] if _mha.openmp_executor else [])


def randn(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_every_executor_gives_the_same_bits(threads):
    q, k = randn(2, 8, 70, 64), randn(2, 4, 300, 64, seed=1)
    want = mha.attention(q, k, k, is_causal=True, enable_gqa=True, backend="tbb", threads=2, executor="tbb")
    assert (
        want
        - F.scaled_dot_product_attention(
            q, k.repeat_interleave(2, 1), k.repeat_interleave(2, 1), is_causal=True
        )
    ).abs().max() < 1e-5
    module = torch.nn.MultiheadAttention(64, 4, batch_first=True).eval()
    plan = mha.Plan.from_module(module, context_length=64, backend="tbb")
    x = randn(3, 40, 64, seed=2)
    y = plan(x, threads=2, executor="tbb")
    for executor in EXECUTORS + [None]:
        got = mha.attention(
            q, k, k, is_causal=True, enable_gqa=True, backend="tbb", threads=threads, executor=executor
        )
        assert torch.equal(got, want), executor
        assert torch.equal(plan(x, threads=threads, executor=executor), y), executor
        cache = plan.make_cache(3, 64)
        plan(x[:, :39], cache=cache, executor=executor)
        assert torch.equal(plan(x[:, 39:], cache=cache, executor=executor), y[:, 39:]), executor


def test_inside_pytorch_the_automatic_choice_is_its_pool():
    runtimes = _executor.openmp_runtimes()
    said = mha.default_executor()
    if _mha.openmp_executor and torch.backends.openmp.is_available() and runtimes and len(runtimes) == 1:
        assert said.startswith("openmp: PyTorch's OpenMP runtime")
        assert _executor.resolve(None, 0) == ("openmp", torch.get_num_threads())
        assert _executor.resolve(None, 3) == ("openmp", 3)
    else:
        assert said.startswith("tbb: ")
    assert _executor.resolve("tbb", 0) == (None, 0)
    assert _executor.resolve("serial", 2) == ("serial", 2)
    plan = mha.Plan.from_module(torch.nn.MultiheadAttention(32, 2, batch_first=True).eval(), context_length=8)
    assert f"executor=auto, now {said.split(':')[0]}" in repr(plan)
    plan.executor = "serial"
    assert "executor=serial" in repr(plan)


def test_a_second_openmp_runtime_falls_back_to_tbb_saying_why(monkeypatch):
    monkeypatch.setattr(_executor, "_openmp", None)
    monkeypatch.setattr(_executor, "openmp_runtimes", lambda: ["/a/libgomp.so.1", "/b/libgomp-1a2b.so.1"])
    said = mha.default_executor()
    assert said.startswith("tbb: 2 OpenMP runtimes are loaded (/a/libgomp.so.1, /b/libgomp-1a2b.so.1)")
    assert _executor.resolve(None, 0) == (None, 0)
    q = randn(1, 2, 3, 16)
    assert torch.equal(
        mha.attention(q, q, q, backend="tbb"), mha.attention(q, q, q, backend="tbb", executor="tbb")
    )


def test_unknown_executors_are_named():
    q = randn(1, 2, 3, 16)
    with pytest.raises(mha.InvalidArgument, match="executor 'gomp' is not one of tbb, openmp, serial"):
        mha.attention(q, q, q, executor="gomp")
    plan = mha.Plan.from_module(torch.nn.MultiheadAttention(32, 2, batch_first=True).eval(), context_length=8)
    with pytest.raises(mha.InvalidArgument, match="executor 3"):
        plan(np.zeros((1, 2, 32), np.float32), executor=3)
    pytest.importorskip("transformers")
    from mha import transformers as integration

    with pytest.raises(mha.InvalidArgument, match="register: executor 'omp'"):
        integration.register("mha_omp", executor="omp")


# Runs in a process of its own: which threads exist depends on what ran before in the process.
_THREADS = textwrap.dedent(
    """
    import os, sys, torch, mha
    torch.set_num_threads(2)
    torch.ones(1 << 22).add_(1)  # a parallel region: PyTorch's OpenMP team starts
    before = set(os.listdir("/proc/self/task"))
    q, k = torch.randn(1, 12, 128, 64), torch.randn(1, 12, 512, 64)
    for _ in range(20):
        mha.attention(q, k, k, backend="tbb", executor=None if sys.argv[1] == "auto" else sys.argv[1])
    print(len(set(os.listdir("/proc/self/task")) - before))
    """
)


def _new_threads(executor: str) -> int:
    run = subprocess.run(
        [sys.executable, "-c", _THREADS, executor],
        capture_output=True,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "2"},
        timeout=120,
        check=True,
    )
    return int(run.stdout.split()[-1])


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="needs /proc/self/task")
def test_inside_pytorch_mha_starts_no_threads_of_its_own():
    """Where the automatic choice is OpenMP, mha's tasks run on the team PyTorch started: no
    thread appears. oneTBB (the control) starts its workers where it may use two CPUs."""
    if not mha.default_executor().startswith("openmp"):
        pytest.skip(mha.default_executor())
    assert _new_threads("auto") == 0
    # The control: oneTBB sizes its pool by the CPUs the process may run on (its affinity mask);
    # on one CPU it starts no worker either, and shows nothing.
    if len(os.sched_getaffinity(0)) >= 2:
        assert _new_threads("tbb") >= 1
