"""What every adapter's tests do the same way: shapes from their names, the (variant, shape)
cases an adapter computes, a call's first run checked against the float64 oracle as the runner
checks it (mhapy.peers.run.first_run_error)."""

from __future__ import annotations

import pytest

from mhapy import inputs, oracle
from mhapy.peers import run
from mhapy.problem import Shape, parse_shape


def shape(text: str) -> Shape:
    return parse_shape(text.split("/"))


def computed(peer, variants: dict, shapes: list[str], only_first: set[str] = frozenset()):
    """pytest params (variant, shape) of every shape a variant does not decline; variants whose
    backend is in only_first get the first shape only (e.g. torch_compile: seconds per compile)."""
    for key, variant in variants.items():
        for text in shapes[:1] if variant.backend in only_first else shapes:
            s = shape(text)
            if peer.declines(variant, s) is None:
                label = "-".join(key) if isinstance(key, tuple) else key
                yield pytest.param(variant, s, id=f"{label}-{text}")


def prepared(peer, variant, s: Shape, threads: int = 1):
    """The variant's call on the shape's inputs (mhapy.inputs), not yet run, and those inputs."""
    w, x = inputs.weights(s), inputs.x(s)
    return peer.prepare(variant, s, w, x, threads), w, x


def assert_first_run_computes_the_function(call, s: Shape, w, x) -> None:
    """Rewinds and runs the call; its y must be the oracle's within the runner's tolerance."""
    rows = oracle.forward_rows(s, w, x, inputs.sample_rows(s.batch, s.seq_len))
    error, bound = run.first_run_error(call, s, rows)
    assert error <= bound, (s, error, bound)
