"""mha itself called from Python: the `mha` package (python/mha) running the same backends as
mha_bench's rows through mha.Plan, so that the report shows what the Python layer costs next to
the C++ figure of the same backend and shape.

Each call is plan(x, out=y, threads=n) on NumPy arrays (read and written in place); a decode
step runs through the plan's cache, filled once with s.past tokens of x = 0 and set back to them
with Cache.truncate after each step (free: only the lengths change). The package is the one
`pip install .` installs, or the test build's (build/<dir>/python on PYTHONPATH: scripts/sweep.sh
builds it with --with-peers).
"""

from __future__ import annotations

import numpy as np

from ..inputs import Weights
from ..problem import Shape
from .adapter import CACHE_SLACK_CALLS, Call, Peer, Unavailable, Variant

# The backends mha_bench ranks first, in the formulation each is fastest in.
VARIANTS = [
    Variant("py_tbb", "split_weight", "mha.Plan(backend='tbb') from Python, NumPy in and out"),
    Variant("py_tbb", "fused_qkv", "mha.Plan(backend='tbb', formulation='fused_qkv') from Python"),
    Variant("py_xsimd", "split_weight", "mha.Plan(backend='xsimd') from Python, NumPy in and out"),
]


def state_dict(w: Weights) -> dict[str, np.ndarray]:
    """w in the split layout (the seeds' names)."""
    out = {}
    for name, layer in (
        ("W_query", w.query),
        ("W_key", w.key),
        ("W_value", w.value),
        ("out_proj", w.out_proj),
    ):
        if layer is None:
            continue
        out[f"{name}.weight"] = layer.weight
        if layer.bias is not None:
            out[f"{name}.bias"] = layer.bias
    return out


class PlanCall(Call):
    def __init__(self, plan, x: np.ndarray, threads: int):
        self.plan, self.x, self.threads = plan, x, threads
        self.y = np.empty((x.shape[0], x.shape[1], plan.config.d_out), np.float32)

    def run(self) -> None:
        self.plan(self.x, out=self.y, threads=self.threads)

    def output(self) -> np.ndarray:
        return self.y


class DecodeCall(PlanCall):
    def __init__(self, plan, x: np.ndarray, threads: int, s: Shape):
        super().__init__(plan, x, threads)
        capacity = s.past + s.seq_len * (1 + CACHE_SLACK_CALLS)
        self.cache = plan.make_cache(s.batch, capacity, s.kv_precision or None)
        self.kv_cache_precision = self.cache.precision
        self.past = s.past
        zeros = np.zeros((s.batch, s.past, s.d_in), np.float32)
        plan(zeros, cache=self.cache, threads=threads)

    def run(self) -> None:
        self.plan(self.x, out=self.y, cache=self.cache, threads=self.threads)

    def rewind(self) -> None:
        for b in range(self.cache.batch):
            self.cache.truncate(b, self.past)

    def close(self) -> None:
        self.cache = None


class MhaPython(Peer):
    library = "mha_python"

    def __init__(self, mha):
        self.mha = mha
        self.backends = {b.name: b for b in mha.backends()}

    def config(self, s: Shape, context_length: int):
        return self.mha.Config(
            d_in=s.d_in,
            d_out=s.d_out,
            n_heads=s.n_heads,
            context_length=context_length,
            causal=s.causal,
            qkv_bias=s.qkv_bias,
            out_proj=s.out_proj,
            out_proj_bias=s.out_proj_bias,
            n_kv_heads=s.n_kv_heads,
            precision=s.precision,
            rope_base=s.rope_base,
            rope_scaling=self.mha.RopeScaling.from_name(s.rope_scaling),
            window=s.window,
        )

    def declines(self, variant: Variant, s: Shape) -> str | None:
        backend = self.backends.get(variant.backend.removeprefix("py_"))
        if backend is None:
            return f"this mha has no {variant.backend.removeprefix('py_')} backend"
        return backend.supports(
            self.config(s, s.past + s.seq_len), variant.formulation, s.past, s.kv_precision or None
        )

    def prepare(self, variant: Variant, s: Shape, w: Weights, x: np.ndarray, threads: int) -> Call:
        context = s.past + s.seq_len * (1 + CACHE_SLACK_CALLS) if s.past else s.seq_len
        plan = self.mha.Plan(
            self.config(s, context),
            state_dict(w),
            backend=variant.backend.removeprefix("py_"),
            formulation=variant.formulation,
        )
        return DecodeCall(plan, x, threads, s) if s.past else PlanCall(plan, x, threads)

    def context(self) -> dict[str, str]:
        return {
            "mha_python_package": self.mha.__file__,
            "mha_python_backends": ", ".join(f"{b.name}: {b.description}" for b in self.mha.backends()),
        }


def make_peer() -> Peer:
    try:
        import mha
    except ImportError as e:
        raise Unavailable(
            f"the mha package is not importable in this Python ({e}): `pip install .` (docs/python.md), "
            "or the test build's <build>/python on PYTHONPATH"
        ) from None
    return MhaPython(mha)
