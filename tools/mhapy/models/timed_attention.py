"""The model's attention function, wrapped: how the models bench (mhapy.models.bench) times
attention's share of a step and one call, and marks the calls for torch.profiler, for any
implementation transformers dispatches to (its registry, or the eager module-level function)."""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

# The name torch.profiler records a call of the attention function under (labelled_attention).
ATTENTION_FUNCTION = "attention function"


@contextlib.contextmanager
def wrapped_attention(model: Any, implementation: str, wrap: Callable[[Any], Any]) -> Iterator[None]:
    """The model's attention function for `implementation` replaced by wrap(function) while
    inside, restored after."""
    import transformers

    if implementation == "eager":  # the model's own module-level function, looked up per call
        module = sys.modules[type(model).__module__]
        saved = module.eager_attention_forward
        module.eager_attention_forward = wrap(saved)
        try:
            yield
        finally:
            module.eager_attention_forward = saved
        return
    mapping = transformers.AttentionInterface._global_mapping
    saved = mapping[implementation]
    mapping[implementation] = wrap(saved)
    try:
        yield
    finally:
        mapping[implementation] = saved


@contextlib.contextmanager
def timed_attention(model: Any, implementation: str, clock: dict) -> Iterator[None]:
    """Adds the seconds spent inside the attention function to clock["attention"], and its
    calls to clock["calls"]."""

    def wrap(f):
        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return f(*args, **kwargs)
            finally:
                clock["attention"] += time.perf_counter() - start
                clock["calls"] += 1

        return timed

    with wrapped_attention(model, implementation, wrap):
        yield


@contextlib.contextmanager
def labelled_attention(model: Any, implementation: str) -> Iterator[None]:
    """Each call of the attention function recorded by torch.profiler as one range named
    ATTENTION_FUNCTION, whatever it runs inside (PyTorch ops, or mha's C++ call, which the
    profiler does not see otherwise)."""
    import torch

    def wrap(f):
        def labelled(*args, **kwargs):
            with torch.profiler.record_function(ATTENTION_FUNCTION):
                return f(*args, **kwargs)

        return labelled

    with wrapped_attention(model, implementation, wrap):
        yield
