"""mhapy.models.step_profile: torch.profiler's events of decode steps as ms a step per op, the attention
function's whole time apart from the ops outside it, and the wall time no op covers."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from mhapy.models.step_profile import OUTSIDE_OPS, per_step
from mhapy.models.timed_attention import ATTENTION_FUNCTION


def event(name, total_us, self_us, parent=None):
    return SimpleNamespace(name=name, cpu_time_total=total_us, self_cpu_time_total=self_us, cpu_parent=parent)


def test_ops_inside_the_attention_function_are_its_own():
    attention = event(ATTENTION_FUNCTION, 300.0, 100.0)
    sdpa = event("aten::scaled_dot_product_attention", 200.0, 50.0, attention)
    inner = event("aten::bmm", 150.0, 150.0, sdpa)  # nested two deep inside the attention function
    linear = event("aten::linear", 500.0, 100.0)
    addmm = event("aten::addmm", 400.0, 400.0, linear)
    got = per_step([attention, sdpa, inner, linear, addmm, event("aten::add", 20.0, 20.0)], 2, 2e-3)
    assert got["steps"] == 2 and got["step_ms"] == pytest.approx(1.0)
    ms = got["ms"]
    assert ms == pytest.approx(
        {
            "aten::addmm": 0.2,
            ATTENTION_FUNCTION: 0.15,
            "aten::linear": 0.05,
            "aten::add": 0.01,
            OUTSIDE_OPS: (2000 - 300 - 500 - 20) / 2e3,  # 0.59
        }
    )
    assert list(ms) == [OUTSIDE_OPS, "aten::addmm", ATTENTION_FUNCTION, "aten::linear", "aten::add"]
    assert sum(ms.values()) == pytest.approx(got["step_ms"])


def test_no_negative_time_outside_and_no_steps_refused():
    got = per_step([event("aten::mm", 900.0, 900.0)], 1, 0.5e-3)  # the profiler's clock past the wall's
    assert got["ms"][OUTSIDE_OPS] == 0.0
    with pytest.raises(ValueError, match="steps 0: expected at least one"):
        per_step([], 0, 1.0)
