"""How every section (and the A/B report) writes numbers, thread counts, and cells above 100%."""

from __future__ import annotations

from .document import Para


def fmt_time(seconds: float) -> str:
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6)):
        if seconds >= scale:
            return f"{seconds / scale:.3g} {unit}"
    return f"{seconds / 1e-9:.3g} ns"


def fmt_ratio(value: float | None) -> str:
    return "–" if value is None else f"{value:.2f}×"


def fmt_gflops(value: float | None, pct: float | None = None) -> str:
    if value is None:
        return "–"
    text = f"{value:.1f}" if value < 1000 else f"{value:.0f}"
    return text if pct is None else f"{text} ({pct:.0f}%)"


def threads_text(n: int) -> str:
    return f"{n} thread" + ("" if n == 1 else "s")


def above_100(above: list[tuple], say) -> list:
    """A paragraph on the cells above 100% of their yardstick (a peak, a bandwidth bound):
    say(count, *the worst), the worst being (%, backend formulation, x, threads); nothing when
    there are none."""
    return [Para(say(len(above), *max(above)))] if above else []
