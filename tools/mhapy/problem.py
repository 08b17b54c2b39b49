"""One problem on the Python side, as include/mha/problem.hpp has it in C++: the shape of a
module and its input, how benchmark names spell it, and its model FLOP count.

Standard library only. The report, the PyTorch peers and the tests all take shapes and FLOPs
from here; the tests pin `flops` to mha::flops through the counts `mha_bench --dump-shapes`
writes (tools/tests/test_problem.py).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, order=True)
class Shape:
    """One module + input shape, as mha::problem without the formulation (and, for now, without
    the grouped K/V, past and precision axes, which the benchmark-name parser does not read)."""

    batch: int
    seq_len: int
    d_in: int
    d_out: int
    n_heads: int
    causal: bool = True
    qkv_bias: bool = False
    out_proj: bool = True

    @property
    def head_dim(self) -> int:
        return self.d_out // self.n_heads

    def flags(self) -> list[str]:
        """The non-default flags in name order: noncausal, qkv_bias, no_out_proj."""
        return [
            name
            for name, on in (
                ("noncausal", not self.causal),
                ("qkv_bias", self.qkv_bias),
                ("no_out_proj", not self.out_proj),
            )
            if on
        ]

    def problem_suffix(self) -> str:
        """'b4/t256/din768/dout768/h12[/flags]': mha::to_string(problem) after the formulation."""
        parts = [
            f"b{self.batch}",
            f"t{self.seq_len}",
            f"din{self.d_in}",
            f"dout{self.d_out}",
            f"h{self.n_heads}",
        ]
        return "/".join(parts + self.flags())

    def label(self) -> str:
        """Short human label: 'B4 T256 d768 H12 (hd 64)', d_in->d_out when they differ."""
        d = f"d{self.d_out}" if self.d_in == self.d_out else f"d{self.d_in}->{self.d_out}"
        text = f"B{self.batch} T{self.seq_len} {d} H{self.n_heads} (hd {self.head_dim})"
        return " ".join([text] + self.flags())


def flops(s: Shape, past: int = 0, n_kv_heads: int = 0) -> int:
    """Model FLOPs of one forward pass (docs/design.md §3), the same for every formulation and
    precision: the count mha_bench's GFLOPS counter divides. past: tokens already cached before
    the call (decode); n_kv_heads: K/V heads, 0 meaning n_heads."""
    d_kv = (n_kv_heads or s.n_heads) * s.head_dim
    # Query-key pairs: each new token sees the cached ones, and itself plus the earlier new
    # ones (causal) or every new one (not causal).
    new = s.seq_len * (s.seq_len + 1) // 2 if s.causal else s.seq_len * s.seq_len
    pairs = s.seq_len * past + new
    tokens = s.batch * s.seq_len
    projections = 2 * tokens * s.d_in * (s.d_out + 2 * d_kv) + (
        2 * tokens * s.d_out**2 if s.out_proj else 0
    )
    scores_and_context = 4 * s.batch * s.n_heads * s.head_dim * pairs
    return projections + scores_and_context
