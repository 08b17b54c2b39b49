"""Where a decode step's time goes: torch.profiler's record of decode steps turned into
milliseconds a step per PyTorch op (models_bench --profile-steps). What it answers: when a
model decodes slower on one attention implementation while its attention calls are no longer,
which of the other ops took the difference, or whether it was spent outside every op."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from .timed_attention import ATTENTION_FUNCTION

OUTSIDE_OPS = "outside any op"  # the steps' wall time no op covers: Python, transformers' own code


def _inside_attention(event: Any) -> bool:
    parent = event.cpu_parent
    while parent is not None:
        if parent.name == ATTENTION_FUNCTION:
            return True
        parent = parent.cpu_parent
    return False


def per_step(events: list[Any], steps: int, wall_s: float) -> dict:
    """From torch.profiler's events of `steps` decode steps that took wall_s seconds (the
    attention function's calls labelled ATTENTION_FUNCTION, timed_attention.labelled_attention):
    the milliseconds a step spent inside the attention function (all of it, the ops it ran
    included), in each other op by name and its self time (its children's apart), and in
    OUTSIDE_OPS, the wall time no op covers; longest first.
    The profiler's own cost is in these times, alike for every implementation."""
    if steps < 1:
        raise ValueError(f"steps {steps}: expected at least one profiled decode step")
    ops: dict[str, float] = defaultdict(float)  # microseconds over all steps
    attention = 0.0
    for e in events:
        if e.name == ATTENTION_FUNCTION:
            attention += e.cpu_time_total
        elif not _inside_attention(e):
            ops[e.name] += e.self_cpu_time_total
    covered = attention + sum(ops.values())
    ms = {ATTENTION_FUNCTION: attention, **ops, OUTSIDE_OPS: max(wall_s * 1e6 - covered, 0.0)}
    ms = {name: us / 1e3 / steps for name, us in sorted(ms.items(), key=lambda kv: -kv[1])}
    return {"steps": steps, "step_ms": wall_s * 1e3 / steps, "ms": ms}
