"""One problem on the Python side, as include/mha/problem.hpp has it in C++: the shape of a
module and its input, how benchmark names spell it (and how to read it back), its model FLOP
count and the bytes a decode step reads at least.

Standard library only. The report, the PyTorch peers, the memory probe and the tests all take
shapes, FLOPs and bytes from here; the tests pin `flops` and the names to mha::flops,
mha::to_string and mha::parse_problem through what `mha_bench --dump-shapes` writes for every
preset, and `decode_bytes` to mha_bench's `bytes_min` counter (tools/tests/test_problem.py).
The grammar of the names is include/mha/problem.hpp's; PARTS below mirrors its C++ table.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from decimal import Decimal

PRECISIONS = ("fp32", "bf16")
# A KV cache's formats (mha::precision: int8 is a cache's only).
KV_PRECISIONS = ("fp32", "bf16", "int8", "k8v4", "int4")
# mha::formulations(), in its order.
FORMULATIONS = ("wrapper", "split_weight", "fused_qkv")


@dataclass(frozen=True, order=True)
class Shape:
    """One module + input shape, as mha::problem without the formulation: `seq_len` new tokens
    per sequence after `past` cached ones (past > 0: an incremental call, docs/design.md §1.4),
    `n_kv_heads` K/V heads (0 means n_heads; n_heads itself is stored as 0, so the two spellings
    are one shape, §1.3), the precision (§1.5), the rotary embedding base (0: none, §1.6) and its
    scaling as names spell it ("" for none, "linear4", "llama3_8_1_4_8192"),
    whether out_proj has its bias (stored as True without an out_proj, which has none to lack)
    and the KV cache's precision (§1.7; "" for the plan's own, which is how it is stored when
    given equal to `precision`)."""

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
    kv_precision: str = ""
    rope_scaling: str = ""
    window: int = 0
    softcap: float = 0.0  # logit soft-capping (0: none), config::softcap
    sinks: bool = False  # a sink logit per query head, config::sinks
    out_features: int = 0  # out_proj's features (0: d_out), config::out_features
    qk_norm_eps: float = 0.0  # the q/k norms' epsilon (0: no q/k norm), config::qk_norm

    def __post_init__(self):
        if self.kv_precision == self.precision:
            object.__setattr__(self, "kv_precision", "")
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

    def problem_suffix(self) -> str:
        """'b4/t256/din768/dout768/h12', 'b1/t1/past1023/din64/dout64/h8/kvh2/bf16':
        mha::to_string(problem) after the formulation, the parts of PARTS in order, each optional
        one only when not its default."""
        return "/".join(text for part in PARTS if (text := part.spell(self)) is not None)

    def label(self) -> str:
        """Short human label: 'B4 T256 d768 H12 (hd 64)', d_in->d_out when they differ, then
        'past P', 'kvh K', 'rope<base>', the flags and the precision when not the default."""
        d = f"d{self.d_out}" if self.d_in == self.d_out else f"d{self.d_in}->{self.d_out}"
        text = f"B{self.batch} T{self.seq_len} {d} H{self.n_heads} (hd {self.head_dim})"
        return " ".join([text] + self.extras())

    def extras(self, past: bool = True) -> list[str]:
        """What label() adds after the sizes: 'past P' (unless past=False), 'kvh K', 'window W',
        then the other optional parts not at their default as names spell them ('rope<base>',
        flags, precision)."""
        out = [f"past {self.past}"] if self.past and past else []
        out += [f"kvh {self.n_kv_heads}"] if self.n_kv_heads else []
        out += [f"window {self.window}"] if self.window else []
        return out + [text for part in PARTS if part.kind != "count" and (text := part.spell(self))]


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


# A rotary base after "rope": a decimal number as std::from_chars reads one (no '+', no hexadecimal).
_DECIMAL = re.compile(r"-?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][-+]?[0-9]+)?")
# A rotary scaling after "rope_" (mha::parse_rope_scaling): linear<factor>,
# llama3_<factor>_<low>_<high>_<original context> or
# yarn_<factor>_<beta_fast>_<beta_slow>_<original context>_<attention factor>_<truncate 0|1>.
_NUMBER = _DECIMAL.pattern
_ROPE_SCALING = re.compile(
    rf"linear{_NUMBER}|llama3_{_NUMBER}_{_NUMBER}_{_NUMBER}_-?[0-9]+"
    rf"|yarn_{_NUMBER}_{_NUMBER}_{_NUMBER}_-?[0-9]+_{_NUMBER}_[01]"
)


@dataclass(frozen=True)
class Part:
    """One part of a canonical problem string after the formulation: `prefix`, then the value of
    Shape's `field`; left out when the shape has `default` (None: required, always written).
    `kind` says how the value is spelled: "count" (decimal digits), "decimal" (shortest_decimal),
    "flag" (the prefix alone, for a field not at its default), "name" (the value alone, one of
    `names`) or "rope_scaling" (the text mha::rope_scaling_name writes)."""

    prefix: str
    field: str
    default: object = None
    kind: str = "count"
    names: tuple[str, ...] = ()

    def spell(self, shape: Shape) -> str | None:
        """The part as `shape` spells it, None when it is left out."""
        value = getattr(shape, self.field)
        if self.default is not None and value == self.default:
            return None
        if self.kind == "flag":
            return self.prefix
        return self.prefix + (shortest_decimal(value) if self.kind == "decimal" else str(value))

    def read(self, text: str) -> object:
        """The field's value that `text` spells, None when `text` is not this part."""
        if not text.startswith(self.prefix):
            return None
        value = text[len(self.prefix) :]
        if self.kind == "count":
            return int(value) if value.isascii() and value.isdigit() else None
        if self.kind == "decimal":
            return float(value) if _DECIMAL.fullmatch(value) else None
        if self.kind == "flag":
            return (not self.default) if value == "" else None
        if self.kind == "rope_scaling":
            return value if _ROPE_SCALING.fullmatch(value) else None
        return value if value in self.names else None


# The parts of a canonical problem string after the formulation, in the order mha::to_string
# writes them, with their spelling and defaults: the mirror of `parts` in src/core/problem.cpp,
# row for row (tools/tests/test_problem.py holds the two to the same names on every preset).
# Shape stores n_kv_heads = n_heads as 0 and out_proj_bias as True without an out_proj, so the
# defaults here leave out what mha::to_string leaves out.
PARTS = (
    Part("b", "batch"),
    Part("t", "seq_len"),
    Part("past", "past", 0),
    Part("din", "d_in"),
    Part("dout", "d_out"),
    Part("h", "n_heads"),
    Part("kvh", "n_kv_heads", 0),
    Part("rope", "rope_base", 0.0, "decimal"),
    Part("rope_", "rope_scaling", "", "rope_scaling"),
    Part("w", "window", 0),
    Part("cap", "softcap", 0.0, "decimal"),
    Part("sinks", "sinks", False, "flag"),
    Part("noncausal", "causal", True, "flag"),
    Part("qkv_bias", "qkv_bias", False, "flag"),
    Part("no_out_proj", "out_proj", True, "flag"),
    Part("no_out_bias", "out_proj_bias", True, "flag"),
    Part("out", "out_features", 0),
    Part("qknorm", "qk_norm_eps", 0.0, "decimal"),
    Part("", "precision", "fp32", "name", PRECISIONS),
    Part("kv_", "kv_precision", "", "name", KV_PRECISIONS),
)


def check_formulation(formulation: str) -> None:
    """Raises ProblemError unless `formulation` is one of FORMULATIONS."""
    if formulation not in FORMULATIONS:
        raise ProblemError(f"unknown formulation '{formulation}'; expected {', '.join(FORMULATIONS)}")


def parse_shape(parts: list[str]) -> Shape:
    """The Shape of the parts of a canonical problem string after the formulation, in any order,
    each at most once, as mha::parse_problem reads them (PARTS). Raises ProblemError naming the
    part it cannot read, a part given twice, the required parts missing, or sizes that do not
    divide (d_out by H, H by kvh)."""
    fields: dict[str, object] = {}
    for text in parts:
        for part in PARTS:
            value = part.read(text)
            if value is not None:
                break
        else:
            raise ProblemError(f"unknown name component '{text}'")
        if part.field in fields:
            which = part.prefix if part.kind == "count" else f"'{text}'"
            raise ProblemError(f"name component {which} given twice")
        fields[part.field] = value
    missing = [p.prefix for p in PARTS if p.default is None and p.field not in fields]
    if missing:
        raise ProblemError(f"missing name component(s) {', '.join(missing)}", missing)
    h, d_out, kvh = fields["n_heads"], fields["d_out"], fields.get("n_kv_heads", 0)
    if h == 0 or d_out % h:
        raise ProblemError(f"d_out ({d_out}) is not a multiple of H ({h})")
    if kvh and h % kvh:
        raise ProblemError(f"H ({h}) is not a multiple of kvh ({kvh})")
    return Shape(**fields)


def pairs(s: Shape) -> int:
    """The (query, key) pairs one sequence's call attends (docs/design.md §3): each new token
    sees the cached ones, and itself plus the earlier new ones (causal) or every new one (not
    causal); with a sliding window, the query at position a sees min(a + 1, window) keys."""
    if s.causal and s.window:
        end = s.past + s.seq_len
        growing_end = min(end, max(s.past, s.window))
        return (growing_end * (growing_end + 1) - s.past * (s.past + 1)) // 2 + s.window * (end - growing_end)
    new = s.seq_len * (s.seq_len + 1) // 2 if s.causal else s.seq_len * s.seq_len
    return s.seq_len * s.past + new


def flops(s: Shape) -> int:
    """Model FLOPs of one call (docs/design.md §3), the same for every formulation and
    precision: the count mha_bench's GFLOPS counter divides, with d_kv = kv_heads · head_dim and
    the queries attending after `past` cached tokens."""
    d_kv = s.kv_heads * s.head_dim
    tokens = s.batch * s.seq_len
    out = (s.out_features or s.d_out) if s.out_proj else 0
    projections = 2 * tokens * s.d_in * (s.d_out + 2 * d_kv) + 2 * tokens * s.d_out * out
    scores_and_context = 4 * s.batch * s.n_heads * s.head_dim * pairs(s)
    return projections + scores_and_context


def cache_heads(s: Shape, formulation: str) -> int:
    """K/V heads a KV cache holds (docs/design.md §1.4, mha::plan::cache_heads): kv_heads in
    every formulation (the wrapper computes each K/V group once for its query heads)."""
    return s.kv_heads


def element_bytes(precision: str) -> int:
    """Bytes of one weight or cached element in a float precision: 4 (fp32) or 2 (bf16)."""
    return 4 if precision == "fp32" else 2


# Bytes an int8 row keeps beyond its codes: mha's one 32-bit word, a bf16 scale and an int16 zero
# (docs/design.md §1.7). A peer's 8-bit cache may keep more (OpenVINO: an fp32 scale and zero
# point, 8): the functions below take its count.
INT8_SCALE_BYTES = 4


# Elements per group of a k8v4 cache's 4-bit values, each group with a 32-bit scale and offset
# (src/base/value4.hpp).
VALUE4_GROUP = 32
# Tokens per channel group of an int4 cache's 4-bit keys, each channel of a group with a 32-bit
# scale and offset (src/base/key4.hpp).
KEY4_GROUP = 64


def cache_token_bytes(s: Shape, scale_bytes: int = INT8_SCALE_BYTES) -> float:
    """Bytes of one cached token's key and value rows (head_dim elements each) in s's cache
    precision: 4 or 2 per element; int8 one code per element and `scale_bytes` per row; k8v4 the
    key as int8's, the value half a byte per element and 4 bytes per group of VALUE4_GROUP; int4
    the value as k8v4's, the key half a byte per element and 4 bytes per channel over KEY4_GROUP
    tokens."""
    cache = s.kv_precision or s.precision
    if cache == "int8":
        return 2 * (s.head_dim + scale_bytes)
    if cache == "k8v4":
        groups = -(-s.head_dim // VALUE4_GROUP)
        return s.head_dim + scale_bytes + -(-s.head_dim // 2) + 4 * groups
    if cache == "int4":
        groups = -(-s.head_dim // VALUE4_GROUP)
        return 2 * -(-s.head_dim // 2) + 4 * s.head_dim / KEY4_GROUP + 4 * groups
    return 2 * s.head_dim * element_bytes(cache)


def cache_bytes(s: Shape, formulation: str, capacity: int, scale_bytes: int = INT8_SCALE_BYTES) -> float:
    """The stated size of s's KV cache of `capacity` tokens for s.batch sequences, without its
    layout's padding: B · capacity · H_kv tokens of cache_token_bytes (docs/design.md §1.4)."""
    return s.batch * capacity * cache_heads(s, formulation) * cache_token_bytes(s, scale_bytes)


def decode_bytes(s: Shape, formulation: str, scale_bytes: int = INT8_SCALE_BYTES) -> int:
    """The least an incremental call reads (mha_bench's `bytes_min`): every weight once in the
    plan's precision (Q, and K, V for each cached head; out_proj when present) and the cached
    and new tokens' keys and values once in the cache's."""
    heads = cache_heads(s, formulation)
    weights = s.d_in * (s.d_out + 2 * heads * s.head_dim) + (s.d_out * s.d_out if s.out_proj else 0)
    cached = cache_bytes(s, formulation, s.past + s.seq_len, scale_bytes)
    return element_bytes(s.precision) * weights + cached
