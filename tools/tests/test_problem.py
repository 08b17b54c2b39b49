"""mhapy.problem: the FLOP count of docs/design.md §3 by hand on small shapes, and against the
counts and names mha_bench itself writes (`--dump-shapes`, when ctest gives its path in
MHA_BENCH), which the peers read: on every preset's problems, mhapy spells and parses the names
as mha::to_string and mha::parse_problem do."""

import dataclasses
import json
import os
import re
import subprocess

import pytest

from mhapy.peers import run
from mhapy.problem import ProblemError, Shape, cache_bytes, decode_bytes, flops, parse_shape, shortest_decimal

# B1 T2 d_in 3 d_out 4 H2 (head_dim 2), counted term by term:
#   Q, K, V: 2·B·T·d_in·(d_out + 2·d_kv) = 2·1·2·3·(4 + 8) = 144 (d_kv = 4; n_kv_heads 1: 2, so 96)
#   out_proj: 2·B·T·d_out² = 64
#   scores and context: 4·B·H·head_dim·pairs = 16·pairs, pairs = T(T+1)/2 = 3 causal, T² = 4
#   not, T·past + 3 = 9 with past 3 (causal), T·(past + T) = 10 (not causal)
SMALL = Shape(1, 2, 3, 4, 2)


@pytest.mark.parametrize(
    "shape, past, n_kv_heads, expected",
    [
        (SMALL, 0, 0, 144 + 64 + 48),
        (Shape(1, 2, 3, 4, 2, causal=False), 0, 0, 144 + 64 + 64),
        (Shape(1, 2, 3, 4, 2, out_proj=False), 0, 0, 144 + 48),
        (Shape(1, 2, 3, 4, 2, qkv_bias=True), 0, 0, 144 + 64 + 48),  # biases are not counted
        (SMALL, 3, 0, 144 + 64 + 144),
        (Shape(1, 2, 3, 4, 2, causal=False), 3, 0, 144 + 64 + 160),
        (SMALL, 0, 1, 96 + 64 + 48),
        (SMALL, 0, 2, 144 + 64 + 48),  # n_kv_heads = H is multi-head attention
        (Shape(3, 2, 3, 4, 2), 0, 0, 3 * (144 + 64 + 48)),
        # Sliding windows: position a sees min(a + 1, w) keys.
        (Shape(1, 2, 3, 4, 2, window=1), 0, 0, 144 + 64 + 32),
        (Shape(1, 2, 3, 4, 2, window=2), 0, 0, 144 + 64 + 48),
        (Shape(1, 2, 3, 4, 2, window=1), 3, 0, 144 + 64 + 32),
        (Shape(1, 2, 3, 4, 2, window=3), 3, 0, 144 + 64 + 96),
        # GPT-2 small's attention, B1 T128: the count mha_bench reports for it.
        (Shape(1, 128, 768, 768, 12), 0, 0, 629342208),
    ],
)
def test_flops_term_by_term(shape, past, n_kv_heads, expected):
    assert flops(dataclasses.replace(shape, past=past, n_kv_heads=n_kv_heads)) == expected


def test_flops_do_not_depend_on_how_d_out_is_split_into_heads():
    assert {flops(Shape(2, 16, 64, 64, h)) for h in (1, 2, 4, 8, 16, 32, 64)} == {
        flops(Shape(2, 16, 64, 64, 1))
    }


def test_bytes_a_decode_step_reads_and_the_cache_holds():
    # B2 T1 past 5, d_in 3, d_out 4, H2 (head_dim 2), out_proj: weights 3·(4 + 2·4) + 4·4 = 52
    # floats; keys and values of 6 tokens, 2 sequences, 4 = H·head_dim wide: 2·2·6·4 = 96.
    s = Shape(2, 1, 3, 4, 2, past=5)
    assert decode_bytes(s, "split_weight") == decode_bytes(s, "wrapper") == 4 * (52 + 96)
    assert cache_bytes(s, "wrapper", 6) == 4 * 96
    # One K/V head (d_kv = 2): half the K/V weights and cache, in every formulation (the
    # wrapper computes each K/V group once for its heads).
    grouped = dataclasses.replace(s, n_kv_heads=1)
    for form in ("split_weight", "wrapper", "fused_qkv"):
        assert decode_bytes(grouped, form) == 4 * (3 * (4 + 2 * 2) + 16 + 48)
        assert cache_bytes(grouped, form, 6) == 4 * 48
    assert decode_bytes(dataclasses.replace(s, out_proj=False), "split_weight") == 4 * (36 + 96)


def test_bytes_follow_the_plan_and_cache_precisions():
    # The shape above: 52 weights; 2·2·6·2 = 48 cached rows of head_dim 2 (96 elements).
    s = Shape(2, 1, 3, 4, 2, past=5)
    bf16 = dataclasses.replace(s, precision="bf16")
    assert decode_bytes(bf16, "split_weight") == 2 * 52 + 2 * 96
    # int8: per row head_dim codes and one 4-byte word (a bf16 scale, an int16 zero), whatever
    # the plan; a peer's rows may keep more (OpenVINO's: two fp32).
    for plan, weight_bytes in (("fp32", 4), ("bf16", 2)):
        int8 = dataclasses.replace(s, precision=plan, kv_precision="int8")
        assert cache_bytes(int8, "split_weight", 6) == 48 * (2 + 4)
        assert decode_bytes(int8, "split_weight") == weight_bytes * 52 + 48 * (2 + 4)
        assert decode_bytes(int8, "split_weight", scale_bytes=8) == weight_bytes * 52 + 48 * (2 + 8)
        # k8v4: the key row as int8's; the value row a byte per two elements and a 4-byte word per
        # group of 32 (one here): 24 tokens of (2 + 4) + (1 + 4) bytes.
        k8v4 = dataclasses.replace(s, precision=plan, kv_precision="k8v4")
        assert cache_bytes(k8v4, "split_weight", 6) == 24 * (6 + 5)
    # At head_dim 64 a k8v4 token is 108 bytes where int8's is 136 (0.79x) and int4's 76 (0.56x:
    # 32 bytes of key codes, 4 of its channel group's words, a value as k8v4's); at 256, 420, 520
    # and 304.
    for head_dim, k8v4_bytes, int8_bytes, int4_bytes in ((64, 108, 136, 76), (256, 420, 520, 304)):
        one = Shape(1, 1, head_dim, head_dim, 1, past=0)
        assert cache_bytes(dataclasses.replace(one, kv_precision="k8v4"), "split_weight", 1) == k8v4_bytes
        assert cache_bytes(dataclasses.replace(one, kv_precision="int4"), "split_weight", 1) == int4_bytes
        assert cache_bytes(dataclasses.replace(one, kv_precision="int8"), "split_weight", 1) == int8_bytes
    # GPT-2 small's step over 8k: 59.8 MB with an fp32 cache, 29.9 MB bf16/bf16.
    gpt2 = Shape(1, 1, 768, 768, 12, past=8192)
    assert round(decode_bytes(gpt2, "split_weight") / 1e6, 1) == 59.8
    assert round(decode_bytes(dataclasses.replace(gpt2, precision="bf16"), "split_weight") / 1e6, 1) == 29.9


@pytest.mark.parametrize(
    "text, shape",
    [
        ("b4/t256/din768/dout768/h12", Shape(4, 256, 768, 768, 12)),
        ("b1/t1/past1023/din64/dout64/h8/kvh2/bf16", Shape(1, 1, 64, 64, 8, past=1023, n_kv_heads=2, precision="bf16")),
        # Any order after the formulation, as mha::parse_problem; kvh = H and fp32 are defaults.
        ("bf16/no_out_proj/h8/kvh8/past3/dout16/din8/t2/b3/noncausal/qkv_bias",
         Shape(3, 2, 8, 16, 8, False, True, False, past=3, precision="bf16")),
        ("b1/t1/din8/dout8/h2/fp32/past0", Shape(1, 1, 8, 8, 2)),
        # Rotary embedding (any decimal spelling of the base) and an out_proj without bias; the
        # latter means nothing without an out_proj, as in mha::to_string.
        ("b1/t1/past9/din64/dout64/h8/kvh2/rope500000/no_out_bias",
         Shape(1, 1, 64, 64, 8, past=9, n_kv_heads=2, rope_base=500000.0, out_proj_bias=False)),
        ("no_out_bias/rope1e4/b2/t3/din8/dout8/h2/no_out_proj", Shape(2, 3, 8, 8, 2, out_proj=False, rope_base=1e4)),
        ("b1/t1/din8/dout8/h2/rope0", Shape(1, 1, 8, 8, 2)),
    ],
)  # fmt: skip
def test_names_read_back_in_any_order_and_spell_canonically(text, shape):
    parsed = parse_shape(text.split("/"))
    assert parsed == shape
    assert parse_shape(parsed.problem_suffix().split("/")) == parsed
    canonical = "b1/t1/past1023/din64/dout64/h8/kvh2/rope5e+05/noncausal/no_out_bias/bf16"
    assert parse_shape(canonical.split("/")).problem_suffix() == canonical


# What std::to_chars(double) writes for these (checked with GCC 12's libstdc++): mha::to_string
# spells rope bases so, and problem_suffix must match it.
@pytest.mark.parametrize(
    "value, text",
    [(10000.0, "10000"), (500000.0, "5e+05"), (1e6, "1e+06"), (12345.5, "12345.5"), (1.5e7, "1.5e+07"),
     (100.0, "100"), (2.5, "2.5"), (0.001, "0.001"), (123456789.0, "123456789"), (1e21, "1e+21"),
     (1e16, "1e+16"), (-2.5, "-2.5"), (0.0, "0")],
)  # fmt: skip
def test_numbers_are_spelled_as_cpp_to_chars_spells_them(value, text):
    assert shortest_decimal(value) == text


@pytest.mark.parametrize(
    "text, message",
    [
        ("b1/t1/din8/dout8/h2/x7", "unknown name component 'x7'"),
        ("b1/t1/din8/dout8/h2/past-1", "unknown name component 'past-1'"),
        ("b1/b2/t1/din8/dout8/h2", "name component b given twice"),
        ("b1/t1/din8/dout8/h2/bf16/fp32", "name component 'fp32' given twice"),
        ("b1/din8/h2", r"missing name component\(s\) t, dout"),
        ("b1/t1/din8/dout10/h3", r"d_out \(10\) is not a multiple of H \(3\)"),
        ("b1/t1/din8/dout12/h6/kvh4", r"H \(6\) is not a multiple of kvh \(4\)"),
        ("b1/t1/din8/dout8/h2/rope", "unknown name component 'rope'"),
        ("b1/t1/din8/dout8/h2/rope+5", r"unknown name component 'rope\+5'"),
        ("b1/t1/din8/dout8/h2/ropex", "unknown name component 'ropex'"),
        ("b1/t1/din8/dout8/h2/rope10/rope10", "name component 'rope10' given twice"),
        ("b1/t1/din8/dout8/h2/no_out_bias/no_out_bias", "name component 'no_out_bias' given twice"),
    ],
)
def test_names_outside_the_grammar_are_refused(text, message):
    with pytest.raises(ProblemError, match=message):
        parse_shape(text.split("/"))


MHA_BENCH = os.environ.get("MHA_BENCH")
needs_mha_bench = pytest.mark.skipif(
    not MHA_BENCH, reason="MHA_BENCH (the mha_bench binary) not given; ctest gives it"
)
SHAPE_FIELDS = {f.name for f in dataclasses.fields(Shape)}


def dump_shapes(path, *flags):
    """The shapes `mha_bench --dump-shapes` writes for `flags`, as parsed JSON objects."""
    command = [MHA_BENCH, *flags, "--quiet", "--dump-shapes", str(path)]
    done = subprocess.run(command, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return json.loads(path.read_text())


def shape_of(item):
    """The Shape of a --dump-shapes object's fields (not its name): the keys named as Shape's."""
    return Shape(**{k: v for k, v in item.items() if k in SHAPE_FIELDS})


def check_spelled_alike(item, where):
    """The C++ name of a --dump-shapes object (mha::to_string after the formulation) is the one
    mhapy spells from its fields, reads back as those fields, and counts mhapy's FLOPs."""
    s = shape_of(item)
    assert s.problem_suffix() == item["name"], (where, item)
    assert parse_shape(item["name"].split("/")) == s, (where, item)
    assert flops(s) == item["flops"], (where, item)


@needs_mha_bench
def test_every_presets_problems_are_spelled_alike_in_cpp_and_python(tmp_path):
    usage = subprocess.run([MHA_BENCH, "--help"], capture_output=True, text=True, check=True).stdout
    presets = re.search(r"--preset ([\w|]+)\]", usage).group(1).split("|")  # mha_bench::preset_names()
    assert {"quick", "heads", "decode", "full"} <= set(presets), usage
    for preset in presets:
        items = dump_shapes(tmp_path / "shapes.json", "--preset", preset, "--precision", "fp32,bf16")
        assert any(i.get("precision") == "bf16" for i in items), preset
        for item in items:
            check_spelled_alike(item, preset)


@needs_mha_bench
def test_counts_and_names_are_the_ones_mha_bench_writes(tmp_path):
    path = tmp_path / "shapes.json"
    axes = ["--batch", "1,3", "--seq", "1,7", "--heads", "1,4", "--d-model", "16,24", "--kv-heads", "0,2"]
    axes += ["--past", "0,5", "--backends", "naive"]
    for preset in ("quick", "heads", "decode"):
        items = dump_shapes(path, "--preset", preset, *axes)
        assert any(i.get("past") for i in items) and any(i.get("n_kv_heads") for i in items)
        assert preset != "decode" or any(i.get("kv_precision") == "int8" for i in items)
        for item in items:
            check_spelled_alike(item, preset)
        # The peers read the file as it is (and check the same), every shape.
        jobs = run.shapes_from_file(str(path))
        assert [j.shape.problem_suffix() for j in jobs] == [i["name"] for i in items]
