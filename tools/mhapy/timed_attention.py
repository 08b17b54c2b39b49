"""The time a model spends inside its attention function: how the models bench
(mhapy.models_bench) times attention's share of a step and one call, for any implementation
transformers dispatches to (its registry, or the eager module-level function)."""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Iterator
from typing import Any


@contextlib.contextmanager
def timed_attention(model: Any, implementation: str, clock: dict) -> Iterator[None]:
    """Adds the seconds spent inside the attention function to clock["attention"], and its
    calls to clock["calls"]."""
    import transformers

    def wrap(f):
        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return f(*args, **kwargs)
            finally:
                clock["attention"] += time.perf_counter() - start
                clock["calls"] += 1

        return timed

    mapping = transformers.AttentionInterface._global_mapping
    if implementation == "eager":  # the model's own module-level function, looked up per call
        module = sys.modules[type(model).__module__]
        saved = module.eager_attention_forward
        module.eager_attention_forward = wrap(saved)
        try:
            yield
        finally:
            module.eager_attention_forward = saved
        return
    saved = mapping[implementation]
    mapping[implementation] = wrap(saved)
    try:
        yield
    finally:
        mapping[implementation] = saved
