"""mha.attention side by side with F.scaled_dot_product_attention: the same arguments, the same
meaning (causal alignment, masks, scale, grouped heads, fp32 and bf16), on every backend that runs
it, and the errors it names."""

from __future__ import annotations

import numpy as np
import pytest

import mha

torch = pytest.importorskip("torch")
F = torch.nn.functional

BACKENDS = [b.name for b in mha.backends() if b.supports_attention("fp32") is None]


def sdpa(q, k, v, **kw):
    """SDPA in float64 (the reference), on float32 or bfloat16 operands as given."""
    return F.scaled_dot_product_attention(q.double(), k.double(), v.double(), **kw)


def randn(*shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g)


def operands(b=2, h=4, kv=2, rows=5, keys=9, d=16, seed=0):
    return (
        randn(b, h, rows, d, seed=seed),
        randn(b, kv, keys, d, seed=seed + 1),
        randn(b, kv, keys, d, seed=seed + 2),
    )


def close(got, want, atol=2e-5):
    np.testing.assert_allclose(got.double().numpy(), want.numpy(), rtol=0, atol=atol)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("rows,keys", [(5, 9), (9, 9), (9, 4), (1, 40)])
@pytest.mark.parametrize("is_causal", [False, True])
def test_sdpa_meaning(backend, rows, keys, is_causal):
    q, k, v = operands(rows=rows, keys=keys)
    want = sdpa(q, k, v, is_causal=is_causal, enable_gqa=True)  # top-left when rows != keys
    close(mha.attention(q, k, v, is_causal=is_causal, enable_gqa=True, backend=backend), want)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("rows,keys", [(1, 40), (5, 9), (9, 9)])
def test_bottom_right_is_causal_lower_right(backend, rows, keys):
    from torch.nn.attention.bias import causal_lower_right

    q, k, v = operands(h=2, rows=rows, keys=keys)
    want = sdpa(q, k, v, attn_mask=causal_lower_right(rows, keys))
    got = mha.attention(q, k, v, is_causal=True, causal_alignment="bottom_right", backend=backend)
    close(got, want)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kind", ["bool", "float", "bool_2d", "float_per_head"])
def test_masks(backend, kind):
    q, k, v = operands(rows=6, keys=11)
    g = torch.Generator().manual_seed(5)
    if kind.startswith("bool"):
        mask = torch.rand(2, 1, 6, 11, generator=g) > 0.3
        mask[0, 0, 2] = False  # a row that sees no key: zeros, as SDPA
        if kind == "bool_2d":
            mask = mask[1, 0]
    else:
        mask = torch.randn(2, 4 if kind == "float_per_head" else 1, 6, 11, generator=g)
        mask[mask < -1.0] = float("-inf")
        mask[1, 0, 4] = float("-inf")
    want = sdpa(q, k, v, attn_mask=mask if mask.dtype == torch.bool else mask.double(), enable_gqa=True)
    close(mha.attention(q, k, v, attn_mask=mask, enable_gqa=True, backend=backend), want)


def test_mask_and_causal_both_apply():
    q, k, v = operands(rows=7, keys=7)
    mask = torch.rand(2, 1, 7, 7, generator=torch.Generator().manual_seed(1)) > 0.2
    both = mask & torch.ones(7, 7, dtype=torch.bool).tril()
    want = sdpa(q, k, v, attn_mask=both, enable_gqa=True)
    close(mha.attention(q, k, v, attn_mask=mask, is_causal=True, enable_gqa=True), want)


def test_scale_and_three_dimensional_operands():
    q, k, v = operands(b=1, kv=4)
    want = sdpa(q[0], k[0], v[0], scale=0.37)
    got = mha.attention(q[0], k[0], v[0], scale=0.37)
    assert got.shape == (4, 5, 16)
    close(got, want)


@pytest.mark.parametrize("backend", BACKENDS)
def test_bf16(backend):
    q, k, v = (t.bfloat16() for t in operands(rows=12, keys=30, d=32))
    mask = torch.rand(2, 1, 12, 30, generator=torch.Generator().manual_seed(3)) > 0.25
    got = mha.attention(q, k, v, attn_mask=mask, enable_gqa=True, backend=backend)
    assert got.dtype == torch.bfloat16
    # Against float64 SDPA of the same bf16 operands: the weights rounded to bf16 (2^-9
    # relative) and the output's own rounding (2^-9), at most |v| = 4 here.
    want = sdpa(q, k, v, attn_mask=mask, enable_gqa=True)
    close(got, want, atol=4 * 2.0**-8)
    # And against PyTorch's own bf16 SDPA within the two roundings of the output.
    close(
        got,
        F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True).double(),
        atol=4 * 2.0**-7,
    )


@pytest.mark.parametrize("backend", BACKENDS)
def test_bf16_decode_step_reads_its_operands_in_place(backend):
    """One new token over 300 cached ones, grouped heads, K and V in (B, T, H, D) buffers seen as
    (B, H, T, D): bfloat16 memory reaches the library as it lies (no float32 copy)."""
    q, k, v = (t.bfloat16() for t in operands(rows=1, keys=300, d=64))
    kt, vt = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in (k, v))
    got = mha.attention(q, kt, vt, enable_gqa=True, backend=backend)
    assert got.dtype == torch.bfloat16
    close(got, sdpa(q, k, v, enable_gqa=True), atol=4 * 2.0**-8)
    for t in (q, kt, vt):
        assert mha._attention._memory(torch, t, True).ctypes.data == t.data_ptr()


def test_strided_operands_are_read_in_place():
    """(B, L, H, D) buffers seen as (B, H, L, D), as models hold them, and out= written in place."""
    q, k, v = operands(h=4, kv=4)
    qt, kt, vt = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in (q, k, v))
    out = torch.empty(2, 5, 4, 16).transpose(1, 2)
    assert mha.attention(qt, kt, vt, out=out) is out
    close(out, sdpa(q, k, v))
    last_strided = q.transpose(2, 3).contiguous().transpose(2, 3)  # last dimension not contiguous
    close(mha.attention(last_strided, k, v), sdpa(q, k, v))


def test_numpy_arrays():
    q, k, v = operands(h=2, kv=2)
    mask = np.random.default_rng(0).random((5, 9)) > 0.3
    got = mha.attention(q.numpy(), k.numpy(), v.numpy(), attn_mask=mask)
    assert isinstance(got, np.ndarray) and got.dtype == np.float32
    close(torch.from_numpy(got), sdpa(q, k, v, attn_mask=torch.from_numpy(mask)))


def test_threads_give_the_same_bits():
    if "tbb" not in BACKENDS:
        pytest.skip("tbb is not built")
    q, k, v = operands(rows=70, keys=600, d=64)
    one = mha.attention(q, k, v, is_causal=True, enable_gqa=True, backend="tbb", threads=1)
    two = mha.attention(q, k, v, is_causal=True, enable_gqa=True, backend="tbb", threads=2)
    assert torch.equal(one, two)


def test_errors_name_what_is_wrong():
    q, k, v = operands()
    with pytest.raises(mha.InvalidArgument, match="enable_gqa=True"):
        mha.attention(q, k, v)
    with pytest.raises(mha.Unsupported, match="dropout_p=0.1"):
        mha.attention(q, k, v, dropout_p=0.1, enable_gqa=True)
    with pytest.raises(mha.InvalidArgument, match="does not broadcast"):
        mha.attention(q, k, v, attn_mask=torch.ones(3, 9, dtype=torch.bool), enable_gqa=True)
    with pytest.raises(mha.InvalidArgument, match="float32 or all bfloat16"):
        mha.attention(q.double(), k.double(), v.double(), enable_gqa=True)
    with pytest.raises(mha.InvalidArgument, match="causal_alignment 'diagonal'"):
        mha.attention(q, k, v, is_causal=True, causal_alignment="diagonal", enable_gqa=True)
    with pytest.raises(mha.Unsupported, match="requires grad"):
        mha.attention(q.requires_grad_(), k, v, enable_gqa=True)
    with pytest.raises(mha.InvalidArgument, match="same B and D"):
        mha.attention(q.detach(), k[:, :, :, :8], v[:, :, :, :8], enable_gqa=True)
    # Key heads of none: named as any other count (once a ZeroDivisionError in the package).
    with pytest.raises(mha.InvalidArgument, match="heads and key 0: the query heads must be a multiple"):
        mha.attention(q.detach(), k[:, :0], v[:, :0], enable_gqa=True)
    if "onednn" in [b.name for b in mha.backends()]:
        with pytest.raises(mha.Unsupported, match="onednn"):
            mha.attention(q.detach(), k, v, enable_gqa=True, backend="onednn")


def test_the_transformers_module_names_its_requirement():
    """Without transformers, importing mha.transformers says what it needs."""
    import subprocess
    import sys

    code = "import sys; sys.modules['transformers'] = None; import mha.transformers"
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert run.returncode != 0
    assert "mha.transformers needs PyTorch and Hugging Face transformers 5" in run.stderr


# -- the plain call, read in C++ without NumPy ----------------------------------------------------


def _plain_cases():
    """(name, call arguments) of calls the C++ reader takes: 4-d CPU tensors, float32 or bfloat16,
    last dimension contiguous, no mask."""
    q, k, v = operands(rows=7, keys=40, d=32)
    qt, kt, vt = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in (q, k, v))
    yield "fp32 grouped heads", dict(query=q, key=k, value=v, enable_gqa=True)
    yield (
        "causal bottom-right",
        dict(query=q, key=k, value=v, enable_gqa=True, is_causal=True, causal_alignment="bottom_right"),
    )
    yield (
        "bf16 decode",
        dict(query=q[:, :, :1].bfloat16(), key=k.bfloat16(), value=v.bfloat16(), enable_gqa=True, scale=0.3),
    )
    yield (
        "strided, out=",
        dict(query=qt, key=kt, value=vt, enable_gqa=True, out=torch.empty(2, 7, 4, 32).transpose(1, 2)),
    )
    yield "requires grad, no_grad", dict(query=q.clone().requires_grad_(), key=k, value=v, enable_gqa=True)


@pytest.mark.parametrize("case", [name for name, _ in _plain_cases()])
def test_plain_calls_are_read_in_cpp_with_the_general_paths_bits(case, monkeypatch):
    args = dict(_plain_cases())[case]

    def run():
        if args.get("out") is not None:
            args["out"].zero_()
        with torch.no_grad():
            result = mha.attention(**args)
        if args.get("out") is not None:
            assert result is args["out"]
        return result.clone()

    with monkeypatch.context() as m:  # the plain path only: the general one fails the test
        m.setattr(mha._attention, "_torch_attention", lambda *a: pytest.fail("took the general path"))
        plain = run()
    with monkeypatch.context() as m:  # the general path only
        m.setattr(mha._attention._mha, "_attention_tensors", lambda *a: None)
        general = run()
    assert plain.dtype == args["query"].dtype and (args.get("out") is not None or plain.is_contiguous())
    assert torch.equal(plain, general)
    if "causal_alignment" not in args:  # SDPA's is_causal is top-left
        want = sdpa(
            *(args[n].detach() for n in ("query", "key", "value")),
            **{n: args[n] for n in ("is_causal", "enable_gqa", "scale") if n in args},
        )
        close(plain, want, atol=2e-5 if plain.dtype == torch.float32 else 2**-6)


def test_calls_the_cpp_reader_refuses_take_the_general_path(monkeypatch):
    q, k, v = operands(h=2, kv=2)
    want = sdpa(q, k, v)
    general = []
    torch_attention = mha._attention._torch_attention
    monkeypatch.setattr(
        mha._attention, "_torch_attention", lambda *a: general.append(1) or torch_attention(*a)
    )
    last_strided = q.transpose(2, 3).contiguous().transpose(2, 3)
    for what, call in {
        "a Tensor subclass": lambda: mha.attention(torch.nn.Parameter(q, requires_grad=False), k, v),
        "3-d operands": lambda: torch.stack([mha.attention(q[b], k[b], v[b]) for b in range(2)]),
        "the negative bit": lambda: -mha.attention(torch._neg_view(q), -k, -v),
        "a strided last dimension": lambda: mha.attention(last_strided, k, v),
        "a mask": lambda: mha.attention(q, k, v, attn_mask=torch.ones(5, 9, dtype=torch.bool)),
        "an out of a strided last dimension": lambda: mha.attention(
            q, k, v, out=torch.empty(2, 2, 16, 5).transpose(2, 3)
        ),
    }.items():
        general.clear()
        close(call(), want)
        assert general, f"{what}: the call did not take the general path"
    with pytest.raises(mha.InvalidArgument, match="query is a tensor inside a torch.func transform"):
        torch.func.vmap(lambda a: mha.attention(a, a, a))(torch.stack([q, q]))
