"""What a peer library's adapter is: the contract between mhapy.peers.run (which checks and
times) and one file per library (pytorch.py, openvino.py, onnxruntime.py), as mha::backend is
between mha_bench and a backend.

An adapter declares the ways its library computes mha's function (variants), says for each
shape whether a variant computes it and, when not, why (as mha::backend::supports does), and
prepares a call of one shape at one thread count on the inputs mha_bench uses (mhapy.inputs).
It never checks or times: the runner compares every call's output with the float64 oracle
before timing it, so an adapter that computes something else shows as an error, never a time.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import numpy as np

from ..inputs import Weights
from ..problem import FORMULATIONS, Shape


class Unavailable(Exception):
    """A library that cannot run here (not installed, or built for another machine); the
    message says why. Every variant of it is then declined with that reason."""


@dataclass(frozen=True)
class Variant:
    """One way a library computes the function. `backend` is the name results carry
    (mha/<backend>/<formulation>/...): the library's, or the library's with a suffix for a
    variant of it ("torch_sdpa", "openvino_u8kv"); `formulation` is the one of mha's it
    computes the same way (one projection per Q/K/V: split_weight; one for all three:
    fused_qkv; one per head: wrapper); `what` says how, in a line."""

    backend: str
    formulation: str
    what: str

    def __post_init__(self):
        if self.formulation not in FORMULATIONS:
            raise ValueError(
                f"variant {self.backend}: formulation {self.formulation!r} not in {FORMULATIONS}"
            )


# A decode call's cache has room for this many calls beyond past + T (more with rewind_every):
# enough for the tests, which step a call a few times without rewinding it.
CACHE_SLACK_CALLS = 8


class Call(ABC):
    """One prepared computation: a shape, its weights and input, a thread count. run() is the
    timed work; everything else is not timed."""

    # A decode call's KV cache as the library keeps it ("f32", "bf16", "u8", ...); None for a
    # forward pass. Recorded on the entry.
    kv_cache_precision: str | None = None
    # Calls between two rewind()s that keep a decode step's cache within 1% of past + T tokens
    # (a library whose rewind copies the cache grows it for a few steps); 1: rewind every call.
    rewind_every: int = 1
    # Counters of the call recorded on its entries, e.g. {"compile_s": 41.2}.
    counters: dict[str, float] = {}

    @abstractmethod
    def run(self) -> None:
        """The timed call: one forward pass, or one decode step after `past` cached tokens."""

    @abstractmethod
    def output(self) -> np.ndarray:
        """y of the last run(), float32 (batch, seq_len, d_out)."""

    def rewind(self) -> None:
        """A decode call: puts the cache back to its `past` tokens (untimed). A forward pass has
        nothing to rewind."""

    def close(self) -> None:
        """Frees what the call holds (a cache can be gigabytes) before the next is prepared."""


class Peer(ABC):
    """A peer library. Each adapter module defines VARIANTS (a list of Variant, importable
    without the library) and make_peer(), which imports the library and returns its Peer, or
    raises Unavailable saying why it cannot run here. One Peer per process."""

    library: str  # "pytorch", "openvino", "onnxruntime": the file's name, the results' label

    @abstractmethod
    def declines(self, variant: Variant, s: Shape) -> str | None:
        """None when the variant computes s, else why not (a sentence for people: "no bf16 on
        this CPU (OpenVINO's CPU plugin lists no BF16 capability)")."""

    @abstractmethod
    def prepare(self, variant: Variant, s: Shape, w: Weights, x: np.ndarray, threads: int) -> Call:
        """The call of s with weights w on x (batch, seq_len, d_in) float32, on `threads`
        threads; a decode shape (s.past > 0) with its cache holding s.past tokens of x = 0, as
        mha_bench's decode benchmarks start (bench/README.md). Only for shapes it does not
        decline."""

    @abstractmethod
    def context(self) -> dict[str, str]:
        """The library's versions and settings, for the result file's context."""
