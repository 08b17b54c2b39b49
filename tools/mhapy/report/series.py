"""Series: the shapes along one axis (H at fixed d_model or head_dim, H per K/V grouping, T,
cached tokens), inferred from the shapes whatever the preset, and tables of values along them.
Shared by every topic that draws or tabulates against an axis.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

from ..problem import Shape
from ..schema import is_peer
from .results import ResultSet

# Every formulation (mhapy.problem.FORMULATIONS) in the order the report lists them: the ones
# compared with the wrapper first (formulations.AGAINST_WRAPPER), split_weight the reference of
# fused_qkv.
FORMULATIONS = ("split_weight", "fused_qkv", "wrapper")


@dataclass(frozen=True)
class Series:
    """Shapes along one axis. kind: 'd_model' (fixed d_in, d_out; H varies), 'head_dim'
    (fixed head_dim, d_model = head_dim * H), 'seq' (T varies), 'past' (cached tokens vary:
    decode) or 'kv' (fixed d_model, H varies, K/V heads grouped by `group`: 'H/g', g query
    heads per K/V head, or '1', one K/V head; see kv_series). shapes sorted by x."""

    kind: str
    shapes: tuple[Shape, ...]
    group: str = ""

    def x(self, shape: Shape) -> int:
        return {"seq": shape.seq_len, "past": shape.past}.get(self.kind, shape.n_heads)

    @property
    def x_name(self) -> str:
        return {"seq": "T (tokens)", "past": "past (cached tokens)"}.get(self.kind, "H (heads)")

    @property
    def title(self) -> str:
        s = self.shapes[0]
        flags = "".join(f", {f}" for f in s.extras(past=False))
        d = f"{s.d_out}" if s.d_in == s.d_out else f"{s.d_in}->{s.d_out}"
        if self.kind == "d_model":
            return f"fixed d_model = {d} (B={s.batch}, T={s.seq_len}{flags})"
        if self.kind == "head_dim":
            return (
                f"fixed head_dim = {s.head_dim}, d_model = {s.head_dim}·H (B={s.batch}, T={s.seq_len}{flags})"
            )
        if self.kind == "past":
            return f"B={s.batch}, T={s.seq_len}, d_model = {d}, H = {s.n_heads}{flags}"
        if self.kind == "kv":
            flags = "".join(f", {f}" for f in replace(s, n_kv_heads=0).extras(past=False))
            return f"{kv_group_text(self.group)}, d_model = {d} (B={s.batch}, T={s.seq_len}{flags})"
        return f"d_model = {d}, H = {s.n_heads} (B={s.batch}{flags})"


def kv_group_text(group: str) -> str:
    """A kv series' grouping in words: 'H/4 K/V heads (groups of 4)', '1 K/V head (MQA)'."""
    if group == "1":
        return "1 K/V head (MQA)"
    return f"{group} K/V heads (groups of {group[2:]})"


def _fixed(s: Shape, *varying: str) -> tuple:
    """What a series keeps fixed: every field of the shape but those it varies, so that a field
    added to Shape (a flag, a precision, a window) parts series without being listed here."""
    return tuple(getattr(s, f.name) for f in fields(Shape) if f.name not in varying)


def _series_from_groups(kind: str, groups: dict, x, least: int = 2) -> list[Series]:
    found = []
    for members in groups.values():
        if len({x(s) for s in members}) >= least:
            found.append(Series(kind, tuple(sorted(members, key=x))))
    # Ties broken by the whole first shape: the order never depends on set iteration.
    return sorted(
        found, key=lambda s: (s.shapes[0].batch, s.shapes[0].seq_len, s.shapes[0].d_out, s.shapes[0])
    )


def heads_series(shapes: list[Shape]) -> list[Series]:
    """Every group of >= 2 shapes that differ only in H (fixed d_model), then every group that
    keeps head_dim fixed with d_in = d_out = head_dim * H. A shape may be in several series.
    K/V heads are fixed along a series (_fixed): a shape with grouped K/V heads is never on
    a line of shapes with H K/V heads. The report passes the shapes outside kv_series here
    (mha_heads_series)."""
    by_d_model: dict[tuple, list[Shape]] = {}
    by_head_dim: dict[tuple, list[Shape]] = {}
    for s in set(shapes):
        by_d_model.setdefault(_fixed(s, "n_heads"), []).append(s)
        if s.d_in == s.d_out:
            by_head_dim.setdefault((s.head_dim,) + _fixed(s, "n_heads", "d_in", "d_out"), []).append(s)
    h = lambda s: s.n_heads  # noqa: E731
    return _series_from_groups("d_model", by_d_model, h) + _series_from_groups("head_dim", by_head_dim, h)


def grouped_kv_shapes(shapes: list[Shape]) -> list[Shape]:
    """The shapes with fewer K/V heads than H (n_kv_heads set) whose MHA twin, the same shape
    with H K/V heads, is among `shapes`: the shapes the grouped-query section compares with
    MHA (the heads preset's heads_kv, the decode preset's decode_kv)."""
    present = set(shapes)
    return sorted(s for s in present if s.n_kv_heads and replace(s, n_kv_heads=0) in present)


def _kv_group_rank(group: str) -> tuple:
    return (1, 0) if group == "1" else (0, int(group[2:]))


def kv_series(shapes: list[Shape]) -> list[Series]:
    """The grouped K/V forward passes (grouped_kv_shapes, past = 0) along H: per family (the
    fixed-d_model key of heads_series without the K/V heads) one series per grouping, kind
    'kv': 'H/g' (each K/V head shared by g query heads, g = H / K/V heads; a single K/V head
    counts in it too when another shape of the family has groups of g, as H = 8 with H/8 = 1)
    and '1' (one K/V head, MQA), even of one shape. Ordered by family, then H/g by g, then
    '1'."""
    families: dict[tuple, list[Shape]] = {}
    for s in grouped_kv_shapes(shapes):
        if not s.is_decode:
            families.setdefault(_fixed(s, "n_heads", "n_kv_heads"), []).append(s)
    found = []
    for key, members in families.items():
        sizes = {s.n_heads // s.n_kv_heads for s in members if s.n_kv_heads > 1}
        groups: dict[str, list[Shape]] = {}
        for s in members:
            g = s.n_heads // s.n_kv_heads
            if s.n_kv_heads > 1 or g in sizes:
                groups.setdefault(f"H/{g}", []).append(s)
            if s.n_kv_heads == 1:
                groups.setdefault("1", []).append(s)
        for group, members_ in groups.items():
            series = Series("kv", tuple(sorted(members_, key=lambda s: s.n_heads)), group)
            first = members[0]
            order = (first.batch, first.seq_len, first.d_in, first.d_out)
            found.append(((order, repr(key), _kv_group_rank(group)), series))
    return [series for _, series in sorted(found, key=lambda t: t[0])]


def mha_heads_series(shapes: list[Shape]) -> tuple[list[Series], list[Series]]:
    """(heads_series of the shapes outside kv_series, kv_series): the H series of the
    forward-pass sections and the grouped-query ones. A grouped K/V shape with its MHA twin
    measured is read against it (kv_series); one without (a run at a fixed --kv-heads) stays in
    the H series, along the others of its K/V heads."""
    kv = kv_series(shapes)
    grouped = {s for series in kv for s in series.shapes}
    return heads_series([s for s in shapes if s not in grouped]), kv


def seq_series(shapes: list[Shape]) -> list[Series]:
    """Every group of >= 2 shapes that differ only in T."""
    groups: dict[tuple, list[Shape]] = {}
    for s in set(shapes):
        groups.setdefault(_fixed(s, "seq_len"), []).append(s)
    return _series_from_groups("seq", groups, lambda s: s.seq_len)


def past_series(shapes: list[Shape]) -> list[Series]:
    """The incremental calls (past > 0) grouped by everything but past, one series per group,
    even of one shape (a decode run of one cached length still gets its figure)."""
    groups: dict[tuple, list[Shape]] = {}
    for s in set(shapes):
        if s.is_decode:
            groups.setdefault(_fixed(s, "past"), []).append(s)
    return _series_from_groups("past", groups, lambda s: s.past, least=1)


def formulations_measured(results: ResultSet) -> list[str]:
    """The formulations measured, in FORMULATIONS' order."""
    found = {k.formulation for k in results.measurements}
    return [f for f in FORMULATIONS if f in found]


@dataclass
class SeriesTable:
    """Values along one series at one thread count. columns: names; rows: (x, [value|None])."""

    series: Series
    threads: int
    columns: list
    rows: list[tuple[int, list]]

    def column(self, name) -> list[tuple[int, float]]:
        i = self.columns.index(name)
        return [(x, values[i]) for x, values in self.rows if values[i] is not None]


def variants(results: ResultSet) -> list[tuple[str, str]]:
    """(backend, formulation) pairs measured, mha backends first."""
    pairs = {(k.backend, k.formulation) for k in results.measurements}
    return sorted(pairs, key=lambda p: (is_peer(p[0]), p[0], p[1]))
