"""Sliding windows (docs/design.md §1.9): each windowed shape against its causal twin (the same
shape with window 0) on mha's fastest backend, the speed-up the O(T·w) law allows (the causal
twin's attention pairs over the window's), and the peers that compute a window at the same shape
(PyTorch: SDPA's masked call; ONNX Runtime: GroupQueryAttention's local_window_size); the
section that words them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from ..problem import Shape, pairs
from ..schema import is_peer, peer_library
from .document import Heading, Para, Table
from .results import Measurement, ResultSet
from .wording import fmt_ratio, fmt_time, threads_text


@dataclass
class WindowRow:
    """One windowed shape at one thread count: mha's fastest measurement there (`mha`), the same
    backend and formulation at the causal twin (`causal`, None when not measured), the pairs law
    (causal pairs / window pairs: what skipping the keys outside every window can buy the
    attention, the projections aside) and each peer library's fastest time at the shape."""

    shape: Shape
    threads: int
    mha: Measurement
    causal: Measurement | None
    law: float
    peers: dict[str, Measurement]

    @property
    def speedup(self) -> float | None:
        """causal time / windowed time on the same backend and formulation."""
        return None if self.causal is None else self.causal.median_s / self.mha.median_s

    def versus(self, library: str) -> float | None:
        """The library's time / mha's (above 1: mha is faster)."""
        peer = self.peers.get(library)
        return None if peer is None else peer.median_s / self.mha.median_s


def _fastest(measurements: list[Measurement]) -> Measurement | None:
    return min(measurements, key=lambda m: m.median_s, default=None)


def window_rows(results: ResultSet) -> list[WindowRow]:
    """A row per windowed shape (window > 0) and thread count that an mha backend measured, in
    order of (forward before decode, T or past, window, threads)."""
    found: dict[tuple[Shape, int], list[Measurement]] = {}
    for key, m in results.measurements.items():
        if key.shape.window:
            found.setdefault((key.shape, key.threads), []).append(m)
    rows = []
    for (shape, threads), measured in found.items():
        best = _fastest([m for m in measured if not is_peer(m.key.backend)])
        if best is None:
            continue
        twin = replace(shape, window=0)
        causal = results.get(best.key.backend, best.key.formulation, twin, threads)
        libraries: dict[str, list[Measurement]] = {}
        for m in measured:
            if is_peer(m.key.backend):
                libraries.setdefault(peer_library(m.key.backend), []).append(m)
        peers = {library: _fastest(ms) for library, ms in libraries.items()}
        rows.append(WindowRow(shape, threads, best, causal, pairs(twin) / pairs(shape), peers))
    return sorted(rows, key=lambda r: (r.shape.is_decode, r.shape.past + r.shape.seq_len, r.shape, r.threads))


def _geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values))


# ---------------------------------------------------------------------------------------------
# In words


def section(results: ResultSet) -> list:
    """'Sliding windows': a table per kind of call (forward passes, decode steps) and what the
    peers' times say, plainly where a peer is faster; nothing without windowed shapes."""
    rows = window_rows(results)
    if not rows:
        return []
    libraries = sorted({library for r in rows for library in r.peers})
    blocks: list = [
        Heading(2, "Sliding windows"),
        Para(
            "Each windowed shape (the last w keys of every query, docs/design.md §1.9) on mha's "
            "fastest backend and formulation there, beside the same backend at the shape's causal "
            "twin (window 0). *Law*: the twin's attention pairs over the window's, the speed-up "
            "skipping the keys outside every window allows the attention (the projections cost "
            "the same in both). Peers: each library's fastest time at the windowed shape and, in "
            "brackets, that time over mha's (above 1×: mha is faster)."
        ),
    ]
    for decode in (False, True):
        kind = [r for r in rows if r.shape.is_decode == decode]
        if not kind:
            continue
        header = [
            "past" if decode else "T",
            "window",
            "threads",
            "mha (backend)",
            "causal twin",
            "speed-up",
            "law",
        ]
        table = []
        for r in kind:
            cells = [
                str(r.shape.past if decode else r.shape.seq_len),
                str(r.shape.window),
                str(r.threads),
                f"{fmt_time(r.mha.median_s)} ({r.mha.key.backend} {r.mha.key.formulation})",
                fmt_time(r.causal.median_s) if r.causal else "–",
                fmt_ratio(r.speedup),
                fmt_ratio(r.law),
            ]
            for library in libraries:
                peer = r.peers.get(library)
                cells.append(
                    "–" if peer is None else f"{fmt_time(peer.median_s)} ({fmt_ratio(r.versus(library))})"
                )
            table.append(cells)
        name = "Decode steps (T = 1)" if decode else "Forward passes"
        blocks += [Heading(3, f"{name} with a sliding window"), Table(header + libraries, table)]
    blocks += _verdicts(rows, libraries)
    return blocks


def _verdicts(rows: list[WindowRow], libraries: list[str]) -> list:
    said = []
    for library in libraries:
        for decode in (False, True):
            ratios = [(r.versus(library), r) for r in rows if r.shape.is_decode == decode]
            ratios = [(v, r) for v, r in ratios if v is not None]
            if not ratios:
                continue
            kind = "decode steps" if decode else "forward passes"
            text = (
                f"{library} at {len(ratios)} windowed {kind}: its time is {_geomean([v for v, _ in ratios]):.2f}× "
                "mha's (geometric mean)"
            )
            faster = [(v, r) for v, r in ratios if v < 1]
            if faster:
                v, r = min(faster, key=lambda t: t[0])
                where = f"past {r.shape.past}" if decode else f"T {r.shape.seq_len}"
                text += (
                    f"; **{library} is faster at {len(faster)} of them**, by up to {1 / v:.2f}× "
                    f"({where}, window {r.shape.window}, {threads_text(r.threads)})"
                )
            said.append(Para(text + "."))
    return said
