"""The Python package under hostile use, each case as a hostile user tried it: masks SDPA
refuses, views NumPy and PyTorch allow, arguments the binding would have rejected with its
signature, scales, mixed kinds, sparse, negative-bit, vmapped and meta tensors. Every refusal is
an mha.Error naming the argument; every accepted input is computed as SDPA computes it (float64
SDPA the oracle). Models, the peers' environment and the library's own fixes:
test_hostile_models.py."""

from __future__ import annotations

import mha
import numpy as np
import pytest

torch = pytest.importorskip("torch")
import mha.torch
from sdpa_oracle import F, close, operands, randn, sdpa

# -- integer, float16/float64/complex masks are refused as SDPA refuses them -----------------------

TORCH_MASK_DTYPES = ["uint8", "int8", "int32", "int64", "float16", "float64", "bfloat16", "complex64"]


@pytest.mark.parametrize("query_dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("mask_dtype", TORCH_MASK_DTYPES + ["bool", "float32"])
def test_torch_masks_as_sdpa_takes_them(query_dtype, mask_dtype):
    """What SDPA refuses is refused naming the dtype; what it takes (bool, float32, the query's
    dtype) is computed as SDPA computes it."""
    q, k, v = (t.to(getattr(torch, query_dtype)) for t in operands())
    mask = (randn(5, 7, seed=9) > 0).to(getattr(torch, mask_dtype))
    try:
        F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    except RuntimeError:
        with pytest.raises(mha.InvalidArgument, match=rf"attn_mask has dtype torch\.{mask_dtype}"):
            mha.attention(q, k, v, attn_mask=mask)
        return
    got = mha.attention(q, k, v, attn_mask=mask)
    close(got, sdpa(q, k, v, attn_mask=mask), atol=2e-5 if query_dtype == "float32" else 2**-6)


@pytest.mark.parametrize(
    "mask_dtype", ["uint8", "int32", "int64", "float16", "float64", "complex64", "object"]
)
def test_numpy_masks_other_than_bool_or_float32_are_refused(mask_dtype):
    q, k, v = (t.numpy() for t in operands())
    mask = (np.random.default_rng(0).random((5, 7)) > 0.5).astype(mask_dtype)
    with pytest.raises(mha.InvalidArgument, match=f"attn_mask has dtype {mask_dtype}"):
        mha.attention(q, k, v, attn_mask=mask)


def test_numpy_bool_and_float32_masks_are_computed():
    q, k, v = (t.numpy() for t in operands())
    allowed = np.random.default_rng(1).random((5, 7)) > 0.4
    additive = np.where(allowed, 0.0, -np.inf).astype(np.float32)
    for mask in (allowed, additive):
        close(mha.attention(q, k, v, attn_mask=mask), sdpa(q, k, v, attn_mask=allowed))


# -- a NumPy object mask holding None --------------------------------------------------------------


def test_numpy_object_mask_holding_none_is_refused():
    q, k, v = (t.numpy() for t in operands())
    mask = np.array([[None] * 7] * 5)
    with pytest.raises(mha.InvalidArgument, match="attn_mask has dtype object"):
        mha.attention(q, k, v, attn_mask=mask)


# -- NumPy views with negative strides -------------------------------------------------------------


@pytest.mark.parametrize("axis", [0, 1, 2, 3])
def test_numpy_negative_strides_are_computed(axis):
    q, k, v = (t.numpy() for t in operands())
    flip = [slice(None)] * 4
    flip[axis] = slice(None, None, -1)
    flip = tuple(flip)
    qf, kf, vf = q[flip], k[flip], v[flip]
    mask = (np.random.default_rng(2).random((5, 7)) > 0.3)[::-1, ::-1]
    want = sdpa(qf, kf, vf, attn_mask=mask)
    close(mha.attention(qf, kf, vf, attn_mask=mask), want)
    out = np.full((2, 2, 5, 16), np.nan, np.float32)[flip]
    assert mha.attention(qf, kf, vf, attn_mask=mask, out=out) is out
    close(out, want)
    # (H, L, D) operands and out, as the batch's first
    out3 = np.full((2, 5, 16), np.nan, np.float32)[flip[1:]]
    assert mha.attention(qf[1], kf[1], vf[1], attn_mask=mask, out=out3) is out3
    close(out3, want[1])


# -- arguments the binding would reject with its signature -----------------------------------------


def test_read_only_and_broadcast_numpy_outs_are_refused_by_name():
    q, k, v = (t.numpy() for t in operands())
    read_only = np.empty(q.shape, np.float32)
    read_only.flags.writeable = False
    broadcast = np.broadcast_to(np.empty((1, 2, 5, 16), np.float32), q.shape)
    for out in (read_only, broadcast):
        with pytest.raises(mha.InvalidArgument, match="out is read-only"):
            mha.attention(q, k, v, out=out)


@pytest.mark.parametrize("threads", [2**31, 2**40, -1, 1025, 1.5, "2", True])
def test_threads_out_of_range_are_refused_by_name(threads):
    q, k, v = operands()
    for args in ((q, k, v), (q.numpy(), k.numpy(), v.numpy())):
        with pytest.raises(mha.InvalidArgument, match=r"threads \(.*\) must be an integer in \[0, 1024\]"):
            mha.attention(*args, threads=threads)


def test_numpy_and_max_threads_are_taken():
    q, k, v = operands()
    want = sdpa(q, k, v)
    close(mha.attention(q, k, v, threads=np.int64(1)), want)
    close(mha.attention(q, k, v, threads=mha._attention.MAX_THREADS), want)


def test_backend_not_a_str_is_refused_by_name():
    q, k, v = operands()
    with pytest.raises(mha.InvalidArgument, match="backend 3 must be a name"):
        mha.attention(q, k, v, backend=3)


def test_plan_arguments_out_of_range_are_refused_when_it_is_made():
    module = torch.nn.MultiheadAttention(32, 2, batch_first=True).eval()
    with pytest.raises(mha.InvalidArgument, match=r"threads \(1099511627776\)"):
        mha.Plan.from_module(module, context_length=8, threads=2**40)
    with pytest.raises(mha.InvalidArgument, match=r"context_length \(9223372036854775808\)"):
        mha.Plan.from_module(module, context_length=2**63)
    with pytest.raises(mha.InvalidArgument, match=r"context_length \(9223372036854775808\)"):
        mha.torch.Attention(module, context_length=2**63)
    with pytest.raises(mha.InvalidArgument, match="backend 3"):
        mha.Plan.from_module(module, context_length=8, backend=3)
    with pytest.raises(mha.InvalidArgument, match="precision 3"):
        mha.Plan.from_module(module, context_length=8, precision=3)
    plan = mha.Plan.from_module(module, context_length=8)
    x = np.zeros((1, 2, 32), np.float32)
    with pytest.raises(mha.InvalidArgument, match=r"threads \(2147483648\)"):
        plan(x, threads=2**31)
    with pytest.raises(mha.InvalidArgument, match="precision 8"):
        plan.make_cache(1, 8, precision=8)


def test_cache_arguments_out_of_range_are_refused_by_name():
    module = torch.nn.MultiheadAttention(32, 2, batch_first=True).eval()
    plan = mha.Plan.from_module(module, context_length=8)
    cache = plan.make_cache(2, 8)
    plan(np.zeros((2, 3, 32), np.float32), cache=cache)
    with pytest.raises(
        mha.InvalidArgument, match=r"Cache.truncate: length \(9223372036854775808\).*64-bit integer range"
    ):
        cache.truncate(0, 2**63)
    with pytest.raises(mha.InvalidArgument, match=r"Cache.truncate: b \(9223372036854775808\)"):
        cache.truncate(2**63, 0)
    with pytest.raises(mha.InvalidArgument, match=r"length 4 of sequence 0 must be in \[0, 3\]"):
        cache.truncate(0, 4)
    with pytest.raises(mha.InvalidArgument, match=r"Cache.truncate: length \(1.5\) must be an integer"):
        cache.truncate(0, 1.5)
    with pytest.raises(mha.InvalidArgument, match=r"Cache.reset: b \('0'\) must be an integer"):
        cache.reset("0")
    with pytest.raises(mha.InvalidArgument, match=r"Config: context_length \(9223372036854775808\)"):
        mha.Config(8, 8, 1, 2**63)
    with pytest.raises(mha.InvalidArgument, match=r"Config: n_heads \(2.0\) must be an integer"):
        mha.Config(8, 8, 2.0, 16)
    cache.truncate(np.int64(1), 2)  # NumPy integers are integers
    assert cache.lengths == [3, 2]
    cache.reset(0)
    assert cache.lengths == [0, 2]
    cache.reset()
    assert cache.lengths == [0, 0]


def test_byte_strides_not_a_multiple_of_the_element_are_computed():
    q, k, v = (t.numpy() for t in operands())
    raw = np.zeros(q.nbytes + q.shape[0] * 3 + 1, np.uint8)
    # q's values in a byte buffer, each batch 3 bytes after the last, the first at offset 1.
    odd = np.ndarray(q.shape, np.float32, raw, offset=1, strides=(q[0].nbytes + 3, 5 * 16 * 4, 16 * 4, 4))
    odd[...] = q
    assert not odd.flags.aligned
    close(mha.attention(odd, k, v), sdpa(q, k, v))


# -- NumPy and 0-d scales; a finite scale beyond float32 -------------------------------------------


@pytest.mark.parametrize(
    "scale", [np.float32(0.37), np.float64(0.37), np.array(0.37), np.array(0.37, np.float32), "tensor"]
)
def test_numpy_and_zero_dimensional_scales_are_taken(scale):
    q, k, v = operands()
    scale = torch.tensor(0.37) if isinstance(scale, str) else scale
    want = sdpa(q, k, v, scale=float(scale))
    close(mha.attention(q, k, v, scale=scale), want)
    close(mha.attention(q.numpy(), k.numpy(), v.numpy(), scale=scale), want)


def test_scale_beyond_float32_names_its_range():
    q, k, v = operands()
    with pytest.raises(mha.InvalidArgument, match="scale .*1e\\+39.* beyond float32's range"):
        mha.attention(q, k, v, scale=1e39)
    with pytest.raises(mha.InvalidArgument, match="scale .* must be a real number"):
        mha.attention(q, k, v, scale=torch.ones(2))


# -- the actual mismatch named ---------------------------------------------------------------------


def test_mixed_kinds_are_named():
    q, k, v = operands()
    with pytest.raises(mha.InvalidArgument, match="query is a NumPy array and key a torch.Tensor"):
        mha.attention(q.numpy(), k, v.numpy())
    with pytest.raises(mha.InvalidArgument, match="query is a torch.Tensor and value a NumPy array"):
        mha.attention(q, k, v.numpy())
    with pytest.raises(mha.InvalidArgument, match="query is a NumPy array and attn_mask a torch.Tensor"):
        mha.attention(q.numpy(), k.numpy(), v.numpy(), attn_mask=torch.ones(5, 7, dtype=torch.bool))
    with pytest.raises(mha.InvalidArgument, match="query is a torch.Tensor and out a NumPy array"):
        mha.attention(q, k, v, out=np.empty(q.shape, np.float32))
    with pytest.raises(mha.InvalidArgument, match="query is a torch.Tensor and key a list: pass all"):
        mha.attention(q, k.tolist(), v)


def test_meta_out_names_its_device():
    q, k, v = operands()
    with pytest.raises(mha.InvalidArgument, match="out is on meta"):
        mha.attention(q, k, v, out=torch.empty(q.shape, device="meta"))


def test_numpy_out_with_a_strided_last_dimension_is_written():
    q, k, v = (t.numpy() for t in operands())
    wide = np.full((2, 2, 5, 32), np.nan, np.float32)
    out = wide[..., ::2]
    assert mha.attention(q, k, v, out=out) is out
    close(out, sdpa(q, k, v))
    assert np.isnan(wide[..., 1::2]).all()  # only out's elements written


# -- a leaf out that requires grad -----------------------------------------------------------------


def test_out_requiring_grad_is_refused_under_autograd():
    q, k, v = operands()
    out = torch.empty(q.shape, requires_grad=True)
    with pytest.raises(mha.InvalidArgument, match="out requires grad"):
        mha.attention(q, k, v, out=out)
    with torch.no_grad():  # where torch writes it in place too
        assert mha.attention(q, k, v, out=out) is out
    close(out.detach(), sdpa(q, k, v))


# -- sparse, negative-bit, vmapped and meta tensors ------------------------------------------------


@pytest.mark.parametrize("name", ["query", "key", "value", "attn_mask", "out"])
def test_sparse_and_meta_tensors_are_named(name):
    q, k, v = operands()
    args = {"query": q, "key": k, "value": v, "attn_mask": torch.zeros(5, 7), "out": torch.empty(q.shape)}
    for bad, what in ((args[name].to_sparse(), "layout torch.sparse_coo"), (args[name].to("meta"), "meta")):
        with pytest.raises(mha.InvalidArgument, match=f"{name} (is on|has) {what}"):
            mha.attention(**{**args, name: bad})


def test_negative_bit_tensors_are_computed():
    q, k, v = operands()
    mask = randn(5, 7, seed=4)
    want = sdpa(-q, -k, -v, attn_mask=-mask)
    neg = torch._neg_view
    close(mha.attention(neg(q), neg(k), neg(v), attn_mask=neg(mask)), want)
    qb, kb, vb = (neg(t.bfloat16()) for t in (q, k, v))
    assert qb.is_neg()
    close(mha.attention(qb, kb, vb), sdpa(-q, -k, -v), atol=2**-6)
    out = torch.zeros(q.shape)
    mha.attention(-q, -k, -v, attn_mask=-mask, out=neg(out))
    close(-out, want)


def test_vmapped_tensors_are_named():
    q = operands()[0]
    with pytest.raises(mha.InvalidArgument, match="query is a tensor inside a torch.func transform"):
        torch.func.vmap(lambda a: mha.attention(a, a, a))(q)


# -- nn.MultiheadAttention called with three views of one tensor -----------------------------------


def test_torch_attention_takes_views_of_one_tensor_as_self_attention():
    module = torch.nn.MultiheadAttention(32, 2, batch_first=True).eval()
    attention = mha.torch.Attention(module, context_length=16)
    x = randn(3, 2, 6, 32)
    mask = torch.ones(6, 6, dtype=torch.bool).triu(1)
    with torch.no_grad():
        want, _ = module(x[0], x[0], x[0], attn_mask=mask, need_weights=False)
    got, _ = attention(x[0], x[0], x[0], attn_mask=mask, need_weights=False)
    close(got, want.double(), atol=2e-5)
    for other in (
        x[1],
        x[0].clone(),
        x[0].transpose(0, 1).contiguous().transpose(0, 1),
        torch._neg_view(x[0]),
    ):
        with pytest.raises(mha.Unsupported, match="self-attention"):
            attention(x[0], other, x[0], attn_mask=mask, need_weights=False)
