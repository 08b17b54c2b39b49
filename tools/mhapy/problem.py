"""One problem on the Python side, as include/mha/problem.hpp has it in C++: the shape of a
module and its input, how benchmark names spell it (and how to read it back), its model FLOP
count and the bytes a decode step reads at least.

Standard library only. The report, the PyTorch peers, the memory probe and the tests all take
shapes, FLOPs and bytes from here; the tests pin `flops` and `name` to mha::flops and
mha::to_string through what `mha_bench --dump-shapes` writes, and `decode_bytes` to mha_bench's
`bytes_min` counter (tools/tests/test_problem.py).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from decimal import Decimal

PRECISIONS = ("fp32", "bf16")
# mha::formulations(), in its order.
FORMULATIONS = ("wrapper", "split_weight", "fused_qkv")


@dataclass(frozen=True, order=True)
class Shape:
    """One module + input shape, as mha::problem without the formulation: `seq_len` new tokens
    per sequence after `past` cached ones (past > 0: an incremental call, docs/design.md §1.4),
    `n_kv_heads` K/V heads (0 means n_heads; n_heads itself is stored as 0, so the two spellings
    are one shape, §1.3), the precision (§1.5), the rotary embedding base (0: none, §1.6) and
    whether out_proj has its bias (stored as True without an out_proj, which has none to lack)."""

    batch: int
    seq_len: int
    d_in: int
    d_out: int
    n_heads: int
    causal: bool = True
    qkv_bias: bool = False
    out_proj: bool = True
    past: int = 0
    n_kv_heads: int = 0
    precision: str = "fp32"
    rope_base: float = 0.0
    out_proj_bias: bool = True

    def __post_init__(self):
        if self.n_kv_heads == self.n_heads:
            object.__setattr__(self, "n_kv_heads", 0)
        if not self.out_proj:
            object.__setattr__(self, "out_proj_bias", True)

    @property
    def head_dim(self) -> int:
        return self.d_out // self.n_heads

    @property
    def kv_heads(self) -> int:
        """K/V heads of the split-weight form: n_kv_heads, or n_heads when 0."""
        return self.n_kv_heads or self.n_heads

    @property
    def is_decode(self) -> bool:
        """An incremental call: queries after `past` > 0 cached tokens."""
        return self.past > 0

    def flags(self) -> list[str]:
        """The non-default flags in name order: noncausal, qkv_bias, no_out_proj, no_out_bias."""
        return [
            name
            for name, on in (
                ("noncausal", not self.causal),
                ("qkv_bias", self.qkv_bias),
                ("no_out_proj", not self.out_proj),
                ("no_out_bias", not self.out_proj_bias),
            )
            if on
        ]

    def rope(self) -> list[str]:
        """['rope<base>'] as mha::to_string writes the base (shortest_decimal), [] without."""
        return [f"rope{shortest_decimal(self.rope_base)}"] if self.rope_base else []

    def problem_suffix(self) -> str:
        """'b4/t256[/past<P>]/din768/dout768/h12[/kvh<K>][/rope<base>][/flags][/bf16]':
        mha::to_string(problem) after the formulation, each bracketed part only when not the
        default."""
        parts = [f"b{self.batch}", f"t{self.seq_len}"]
        parts += [f"past{self.past}"] if self.past else []
        parts += [f"din{self.d_in}", f"dout{self.d_out}", f"h{self.n_heads}"]
        parts += [f"kvh{self.n_kv_heads}"] if self.n_kv_heads else []
        parts += self.rope() + self.flags()
        parts += [self.precision] if self.precision != "fp32" else []
        return "/".join(parts)

    def label(self) -> str:
        """Short human label: 'B4 T256 d768 H12 (hd 64)', d_in->d_out when they differ, then
        'past P', 'kvh K', 'rope<base>', the flags and the precision when not the default."""
        d = f"d{self.d_out}" if self.d_in == self.d_out else f"d{self.d_in}->{self.d_out}"
        text = f"B{self.batch} T{self.seq_len} {d} H{self.n_heads} (hd {self.head_dim})"
        return " ".join([text] + self.extras())

    def extras(self, past: bool = True) -> list[str]:
        """What label() adds after the sizes: 'past P' (unless past=False), 'kvh K',
        'rope<base>', flags, precision."""
        out = [f"past {self.past}"] if self.past and past else []
        out += [f"kvh {self.n_kv_heads}"] if self.n_kv_heads else []
        out += self.rope() + self.flags()
        return out + ([self.precision] if self.precision != "fp32" else [])


def shortest_decimal(value: float) -> str:
    """`value` as C++'s std::to_chars(double) writes it (how mha::to_string spells numbers): the
    shortest digits that read back as `value`, in fixed or scientific notation, whichever is
    shorter (fixed on a tie): 10000 -> '10000', 500000 -> '5e+05', 12345.5 -> '12345.5'."""
    sign = "-" if value < 0 else ""
    if value == 0:
        return sign + "0"
    _, digits, exponent = Decimal(repr(abs(value))).normalize().as_tuple()
    digits = "".join(map(str, digits))
    point = len(digits) + exponent  # digits before the decimal point
    if exponent >= 0:
        fixed = digits + "0" * exponent
    elif point > 0:
        fixed = f"{digits[:point]}.{digits[point:]}"
    else:
        fixed = "0." + "0" * -point + digits
    power = point - 1
    mantissa = digits[0] + (f".{digits[1:]}" if len(digits) > 1 else "")
    scientific = f"{mantissa}e{'-' if power < 0 else '+'}{abs(power):02d}"
    return sign + (fixed if len(fixed) <= len(scientific) else scientific)


class ProblemError(ValueError):
    """A problem string that does not follow the grammar; `missing` lists the required parts
    it lacks (None when that is not the fault)."""

    def __init__(self, message: str, missing: list[str] | None = None):
        super().__init__(message)
        self.missing = missing


_NUMBERED = re.compile(r"^(b|t|past|din|dout|h|kvh)(\d+)$")
# rope<base>: a decimal number as std::from_chars reads one (no '+', no hexadecimal).
_ROPE = re.compile(r"^rope(-?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)$")
_REQUIRED = ("b", "t", "din", "dout", "h")
_FLAGS = {
    "noncausal": ("causal", False),
    "qkv_bias": ("qkv_bias", True),
    "no_out_proj": ("out_proj", False),
    "no_out_bias": ("out_proj_bias", False),
}


def check_formulation(formulation: str) -> None:
    """Raises ProblemError unless `formulation` is one of FORMULATIONS."""
    if formulation not in FORMULATIONS:
        raise ProblemError(f"unknown formulation '{formulation}'; expected {', '.join(FORMULATIONS)}")


def parse_shape(parts: list[str]) -> Shape:
    """The Shape of the parts of a canonical problem string after the formulation, in any order
    (the grammar of mha::parse_problem): b<B>, t<T>, din<N>, dout<N>, h<H> required; past<P>,
    kvh<K>, rope<base>, noncausal, qkv_bias, no_out_proj, no_out_bias, fp32 or bf16 optional.
    Raises ProblemError naming the part it cannot read, a part given twice, the required parts
    missing, or sizes that do not divide (d_out by H, H by kvh)."""
    numbers: dict[str, int] = {}
    fields: dict[str, object] = {}
    for part in parts:
        match = _NUMBERED.match(part)
        rope = _ROPE.match(part)
        if match:
            key = match.group(1)
            if key in numbers:
                raise ProblemError(f"name component {key} given twice")
            numbers[key] = int(match.group(2))
        elif part in _FLAGS or part in PRECISIONS or rope:
            field, value = (
                ("rope_base", float(rope.group(1))) if rope else _FLAGS.get(part, ("precision", part))
            )
            if field in fields:
                raise ProblemError(f"name component '{part}' given twice")
            fields[field] = value
        else:
            raise ProblemError(f"unknown name component '{part}'")
    missing = [k for k in _REQUIRED if k not in numbers]
    if missing:
        raise ProblemError(f"missing name component(s) {', '.join(missing)}", missing)
    h, d_out, kvh = numbers["h"], numbers["dout"], numbers.get("kvh", 0)
    if h == 0 or d_out % h:
        raise ProblemError(f"d_out ({d_out}) is not a multiple of H ({h})")
    if kvh and h % kvh:
        raise ProblemError(f"H ({h}) is not a multiple of kvh ({kvh})")
    return Shape(
        batch=numbers["b"],
        seq_len=numbers["t"],
        d_in=numbers["din"],
        d_out=d_out,
        n_heads=h,
        past=numbers.get("past", 0),
        n_kv_heads=kvh,
        **fields,
    )


def flops(s: Shape) -> int:
    """Model FLOPs of one call (docs/design.md §3), the same for every formulation and
    precision: the count mha_bench's GFLOPS counter divides, with d_kv = kv_heads · head_dim and
    the queries attending after `past` cached tokens."""
    d_kv = s.kv_heads * s.head_dim
    # Query-key pairs: each new token sees the cached ones, and itself plus the earlier new
    # ones (causal) or every new one (not causal).
    new = s.seq_len * (s.seq_len + 1) // 2 if s.causal else s.seq_len * s.seq_len
    pairs = s.seq_len * s.past + new
    tokens = s.batch * s.seq_len
    projections = 2 * tokens * s.d_in * (s.d_out + 2 * d_kv) + (2 * tokens * s.d_out**2 if s.out_proj else 0)
    scores_and_context = 4 * s.batch * s.n_heads * s.head_dim * pairs
    return projections + scores_and_context


def cache_heads(s: Shape, formulation: str) -> int:
    """K/V heads a KV cache holds (docs/design.md §1.4, mha::plan::cache_heads): kv_heads in
    every formulation (the wrapper computes each K/V group once for its query heads)."""
    return s.kv_heads


def cache_bytes(s: Shape, formulation: str, capacity: int) -> int:
    """The stated size of a float32 KV cache of `capacity` tokens for s.batch sequences,
    without its layout's padding: 2 · B · capacity · H_kv · head_dim · 4 (docs/design.md §1.4)."""
    return 2 * s.batch * capacity * cache_heads(s, formulation) * s.head_dim * 4


def decode_bytes(s: Shape, formulation: str) -> int:
    """The least an incremental call reads (mha_bench's `bytes_min`): every float32 weight once
    (Q, and K, V for each cached head; out_proj when present) and the cached and new tokens'
    keys and values once."""
    heads = cache_heads(s, formulation)
    weights = s.d_in * (s.d_out + 2 * heads * s.head_dim) + (s.d_out * s.d_out if s.out_proj else 0)
    return 4 * weights + cache_bytes(s, formulation, s.past + s.seq_len)
