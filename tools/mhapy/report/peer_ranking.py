"""mha against the peers: per shape class, precision and thread count, the fastest path (mha's
backend to link or a peer library), and where a peer beats mha, by how much. Numbers and
verdicts first, then the section that words them ("Answer: mha and the peers").

A path is an mha backend (its fastest formulation at each shape) or a peer library (its
fastest variant: PyTorch's best of the seeds' modules, SDPA, nn.MultiheadAttention and
torch.compile; OpenVINO's best cache precision; ...). Shapes fall in classes that change the
answer: forward passes with head_dim of 32 or more, with narrower heads, with grouped K/V heads;
decode steps of one sequence, of a batch, with grouped K/V heads; forward passes and decode steps
with a sliding window (fewer peers compute one).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from ..problem import Shape
from ..schema import is_peer, is_rival, peer_library
from . import figures
from .document import Bullets, Figure, Heading, Para, Table
from .results import Measurement, ResultSet
from .wording import fmt_ratio, fmt_time, threads_text

# Classes in the order the report lists them.
CLASSES = (
    "forward, head_dim ≥ 32",
    "forward, head_dim < 32",
    "forward, grouped K/V heads",
    "decode, B = 1",
    "decode, B > 1",
    "decode, grouped K/V heads",
    "forward, sliding window",
    "decode, sliding window",
)


def shape_class(s: Shape) -> str:
    if s.window:
        return CLASSES[7] if s.is_decode else CLASSES[6]
    if s.is_decode:
        if s.n_kv_heads:
            return CLASSES[5]
        return CLASSES[3] if s.batch == 1 else CLASSES[4]
    if s.n_kv_heads:
        return CLASSES[2]
    return CLASSES[0] if s.head_dim >= 32 else CLASSES[1]


def path_of(backend: str) -> str:
    """The path a backend belongs to: a peer's library ("PyTorch"), or the mha backend itself."""
    return peer_library(backend) if is_peer(backend) else backend


@dataclass
class PeerWin:
    """A shape where a peer library's best is faster than mha's best."""

    shape: Shape
    peer: Measurement  # the peer's fastest variant there
    mha: Measurement  # mha's fastest backend there
    ratio: float  # mha time / peer time (> 1)


@dataclass
class ClassRanking:
    """One class at one precision and thread count. `geomeans`: per path, the geometric mean over
    the class's shapes it measured of its time / the fastest time of any path there (1.0: fastest
    everywhere), with the count of shapes; `wins`: shapes where the path is fastest;
    `versus_mha`: per peer library, the geometric mean over shapes both measured of mha's best
    time / the library's best (above 1.0 the peer is faster); `ratios`: per shape (all of the
    class's, in order) and library, the library's best time / mha's best (None where one is
    missing); `peer_wins`: the shapes where a peer beats mha, largest margin first."""

    shape_class: str
    precision: str
    threads: int
    shapes: int
    fastest: str  # the path with the lowest geomean among those measured on every shape
    geomeans: dict[str, tuple[float, int]]
    wins: dict[str, int]
    best_mha: str | None
    versus_mha: dict[str, tuple[float, int]]
    ratios: dict[Shape, dict[str, float | None]]
    peer_wins: list[PeerWin]


def _best(results: ResultSet, path: str, shape: Shape, threads: int) -> Measurement | None:
    ms = [m for k, m in results.measurements.items() if k.shape == shape and k.threads == threads]
    ms = [m for m in ms if path_of(m.key.backend) == path]
    return min(ms, key=lambda m: m.median_s, default=None)


def _geomean(values: list[float]) -> float:
    return math.exp(sum(map(math.log, values)) / len(values))


def rankings(results: ResultSet) -> list[ClassRanking]:
    """Every (class, precision, threads) with at least one peer and one mha backend measured."""
    out = []
    keys = {(shape_class(k.shape), k.shape.precision, k.threads) for k in results.measurements}
    for cls in CLASSES:
        for precision in ("fp32", "bf16"):
            for threads in sorted({n for c, p, n in keys if c == cls and p == precision}):
                r = _rank(results, cls, precision, threads)
                if r is not None:
                    out.append(r)
    return out


def _rank(results: ResultSet, cls: str, precision: str, threads: int) -> ClassRanking | None:
    shapes = sorted(
        {
            k.shape
            for k in results.measurements
            if k.threads == threads and k.shape.precision == precision and shape_class(k.shape) == cls
        }
    )
    paths = sorted(
        {path_of(k.backend) for k in results.measurements if k.shape in shapes and k.threads == threads}
    )
    peers = sorted({peer_library(k.backend) for k in results.measurements if is_peer(k.backend)} & set(paths))
    mha = [p for p in paths if p not in peers]
    if not peers or not mha:
        return None
    best = {p: {s: m for s in shapes if (m := _best(results, p, s, threads))} for p in paths}
    fastest_at = {
        s: min((best[p][s] for p in paths if s in best[p]), key=lambda m: m.median_s) for s in shapes
    }
    geomeans = {
        p: (_geomean([best[p][s].median_s / fastest_at[s].median_s for s in best[p]]), len(best[p]))
        for p in paths
        if best[p]
    }
    wins = {p: sum(path_of(fastest_at[s].key.backend) == p for s in shapes) for p in paths}
    # mha's best path per shape: the fastest mha backend there.
    mha_best = {
        s: min((best[p][s] for p in mha if s in best[p]), key=lambda m: m.median_s)
        for s in shapes
        if any(s in best[p] for p in mha)
    }
    versus, peer_wins = {}, []
    for p in peers:
        common = [s for s in best[p] if s in mha_best]
        if not common:
            continue
        versus[p] = (_geomean([mha_best[s].median_s / best[p][s].median_s for s in common]), len(common))
        for s in common:
            ratio = mha_best[s].median_s / best[p][s].median_s
            # mha from Python runs mha's kernels: faster than mha_bench's row is noise, not a win.
            if ratio > 1 and is_rival(best[p][s].key.backend):
                peer_wins.append(PeerWin(s, best[p][s], mha_best[s], ratio))
    peer_wins.sort(key=lambda w: -w.ratio)
    ratios = {
        s: {
            p: best[p][s].median_s / mha_best[s].median_s if s in best[p] and s in mha_best else None
            for p in peers
        }
        for s in shapes
    }
    complete = [p for p in paths if geomeans.get(p, (0, 0))[1] == len(shapes)] or list(geomeans)
    fastest = min(complete, key=lambda p: geomeans[p][0])
    mha_complete = [p for p in mha if geomeans.get(p, (0, 0))[1] == len(shapes)] or [
        p for p in mha if p in geomeans
    ]
    best_mha = min(mha_complete, key=lambda p: geomeans[p][0]) if mha_complete else None
    return ClassRanking(
        cls, precision, threads, len(shapes), fastest, geomeans, wins, best_mha, versus, ratios, peer_wins
    )


# ---- in words ----


def _mechanism(m) -> str:
    """How a peer's variant computes (its entry's label after the check's text)."""
    return m.label.split("inputs); ", 1)[-1] if "inputs); " in m.label else m.key.backend


def _peer_cell(r: ClassRanking, library: str) -> str:
    if library not in r.versus_mha:
        return "–"
    ratio, shapes = r.versus_mha[library]
    text = fmt_ratio(1 / ratio) + ("" if shapes == r.shapes else f" ({shapes} of {r.shapes})")
    return f"**{text}**" if ratio > 1 else text


def section(results: ResultSet, folder: Path, prefix: str = "") -> list:
    """The answer with the peers: per shape class, precision and thread count the fastest path
    (an mha backend or a peer library), each library's time against mha's best, and every shape
    where a peer wins, by how much and how it computes. Empty without peers and mha backends."""
    ranked = rankings(results)
    if not ranked:
        return []
    libraries = sorted({lib for r in ranked for lib in r.versus_mha})
    rows = [
        [r.shape_class, r.precision, str(r.threads), str(r.shapes), f"**{r.fastest}**", r.best_mha or "–"]
        + [_peer_cell(r, lib) for lib in libraries]
        for r in ranked
    ]
    blocks: list = [
        Heading(2, "Answer: mha and the peers"),
        Para(
            "Per class of shapes, precision and thread count: the fastest path (an mha backend at its "
            "fastest formulation, or a peer library at its fastest variant: the lowest geometric mean of "
            "its time / the fastest time at each shape, among the paths measured on every shape of the "
            "class), mha's fastest backend, and each peer library's time / mha's fastest time (geometric "
            "mean over the shapes both measured; below 1.0, in bold, the peer is faster). Every peer "
            "output was checked against the float64 oracle on mha's own inputs before it was timed."
        ),
        Table(["class", "precision", "threads", "shapes", "fastest", "mha's fastest"] + libraries, rows),
    ]
    wins = []
    for r in ranked:
        by_library: dict[str, list] = {}
        for w in r.peer_wins:
            by_library.setdefault(path_of(w.peer.key.backend), []).append(w)
        for library, ws in by_library.items():
            top = ws[0]
            wins.append(
                f"**{library} beats mha on {r.shape_class} ({r.precision}, {threads_text(r.threads)}) at "
                f"{len(ws)} of {r.shapes} shapes**, by up to {fmt_ratio(top.ratio)} ({top.shape.label()}: "
                f"{top.peer.key.backend} {fmt_time(top.peer.median_s)} against mha's {top.mha.key.backend} "
                f"{fmt_time(top.mha.median_s)}); how it computes: {_mechanism(top.peer)}."
            )
    blocks.append(
        Bullets(wins) if wins else Para("No peer beats mha's fastest backend at any shape measured here.")
    )
    panels = []
    for r in ranked:
        bars = {lib: [r.ratios[shape][lib] for shape in r.ratios] for lib in libraries if lib in r.versus_mha}
        title = f"{r.shape_class}, {r.precision}, {threads_text(r.threads)}"
        panels.append((title, [shape.label() for shape in r.ratios], bars))
    if panels:
        figures.peer_bars(folder, prefix + "peers", panels)
        blocks.append(
            Figure(prefix + "peers", "Each peer library's fastest time / mha's fastest time, per shape")
        )
    return blocks
