"""The function of docs/design.md §1 in float64 NumPy on a few output rows, as
mha_reference::forward_rows computes it in C++ (src/reference): what the peers' outputs are
checked against before they are timed. fp32 only: a peer's bf16 output is held to the bound of
a bf16 module against this fp32 function (§1.5), which needs the largest score of each row, so
that comes back too. tools/tests/test_inputs.py pins the values to mha_bench's own oracle.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .inputs import Linear, Weights
from .problem import Shape


@dataclass
class Rows:
    """The oracle on some rows: values[r] is y[b][t] for rows[r] = (b, t), (d_out,) float64;
    max_score[r] the largest |q·k|/sqrt(head_dim) row r attends over (every head)."""

    rows: list[tuple[int, int]]
    values: np.ndarray
    max_score: np.ndarray


def _project(layer: Linear, x: np.ndarray) -> np.ndarray:
    y = x @ layer.weight.astype(np.float64).T
    return y + layer.bias.astype(np.float64) if layer.bias is not None else y


def rotate(v: np.ndarray, positions: np.ndarray, head_dim: int, base: float) -> np.ndarray:
    """Rotary embedding (§1.6) of v (tokens, width) in heads of head_dim, token n at
    positions[n], rotate-half convention, angles in float64."""
    half = head_dim // 2
    frequency = base ** (-2.0 * np.arange(half) / head_dim)
    angle = positions[:, None].astype(np.float64) * frequency[None, :]
    cos, sin = np.cos(angle), np.sin(angle)
    heads = v.reshape(v.shape[0], -1, head_dim)
    lo, hi = heads[..., :half], heads[..., half:]
    turned = np.concatenate(
        [lo * cos[:, None, :] - hi * sin[:, None, :], hi * cos[:, None, :] + lo * sin[:, None, :]], axis=-1
    )
    return turned.reshape(v.shape)


def forward_rows(s: Shape, w: Weights, x: np.ndarray, rows: list[tuple[int, int]]) -> Rows:
    """The rows of y for x (batch, seq_len, d_in): with s.past > 0, x is an incremental call's
    tokens after s.past tokens of x = 0 (the state mha_bench's decode benchmarks start from),
    token i at position past + i. Cost: one projection of every token of each sampled batch
    element, then O((past + seq_len) · d_out) per row."""
    hd, group = s.head_dim, s.n_heads // s.kv_heads
    past = s.past
    zero = np.zeros((1, s.d_in))
    k0, v0 = _project(w.key, zero), _project(w.value, zero)
    values = np.zeros((len(rows), s.d_out))
    max_score = np.zeros(len(rows))
    for b in sorted({b for b, _ in rows}):
        xb = x[b].astype(np.float64)
        keys = np.concatenate([np.repeat(k0, past, axis=0), _project(w.key, xb)])
        vals = np.concatenate([np.repeat(v0, past, axis=0), _project(w.value, xb)])
        if s.rope_base:
            keys = rotate(keys, np.arange(past + s.seq_len), hd, s.rope_base)
        for r, (rb, t) in enumerate(rows):
            if rb != b:
                continue
            q = _project(w.query, xb[t : t + 1])
            if s.rope_base:
                q = rotate(q, np.array([past + t]), hd, s.rope_base)
            visible = past + t + 1 if s.causal else past + s.seq_len
            # A sliding window (§1.9): the last `window` keys of the row's, its own included.
            first = max(0, visible - s.window) if s.window else 0
            q = q.reshape(s.n_heads, hd)
            k = keys[first:visible].reshape(visible - first, s.kv_heads, hd)
            v = vals[first:visible].reshape(visible - first, s.kv_heads, hd)
            kv = np.arange(s.n_heads) // group
            scores = np.einsum("hd,jhd->hj", q, k[:, kv, :]) / np.sqrt(hd)
            max_score[r] = np.abs(scores).max()
            a = np.exp(scores - scores.max(axis=1, keepdims=True))
            a /= a.sum(axis=1, keepdims=True)
            context = np.einsum("hj,jhd->hd", a, v[:, kv, :]).reshape(1, s.d_out)
            values[r] = (_project(w.out_proj, context) if w.out_proj is not None else context)[0]
    return Rows(rows, values, max_score)


# The bound of a bf16 module against the fp32 function (docs/design.md §1.5), u = 2^-9: the
# tests hold mha's backends to u·(4 + 4S) · max|y|; a peer that also rounds y to bf16 gets one
# unit more.
BF16_UNIT = 2.0**-9


def bf16_tolerance(max_score: float) -> float:
    """Relative tolerance of a bf16 computation (or a 1-byte KV cache) against the fp32 oracle:
    u·(5 + 4S), S the largest |score|."""
    return BF16_UNIT * (5.0 + 4.0 * max_score)


def relative_error(y: np.ndarray, oracle: Rows) -> float:
    """max |y[b][t] - oracle| / max |oracle| over the oracle's rows; y (batch, seq_len, d_out).
    NaN when y has a NaN there."""
    got = np.stack([np.asarray(y[b, t], dtype=np.float64) for b, t in oracle.rows])
    error = np.abs(got - oracle.values).max()
    scale = np.abs(oracle.values).max()
    return float(error / scale) if scale > 0 else float(error)
