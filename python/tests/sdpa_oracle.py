"""The hostile-input tests' operands and oracle: seeded tensors, float64 SDPA of any operands
(tensors or NumPy arrays), and the comparison against it."""

from __future__ import annotations

import numpy as np
import torch

F = torch.nn.functional


def randn(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def operands(b=2, h=2, rows=5, keys=7, d=16, seed=0):
    return (
        randn(b, h, rows, d, seed=seed),
        randn(b, h, keys, d, seed=seed + 1),
        randn(b, h, keys, d, seed=seed + 2),
    )


def sdpa(q, k, v, **kw):
    """float64 SDPA of the operands' values (tensors or NumPy arrays)."""
    q, k, v = (
        torch.as_tensor(np.ascontiguousarray(t) if isinstance(t, np.ndarray) else t) for t in (q, k, v)
    )
    mask = kw.pop("attn_mask", None)
    if mask is not None:
        mask = torch.as_tensor(np.ascontiguousarray(mask) if isinstance(mask, np.ndarray) else mask)
        kw["attn_mask"] = mask if mask.dtype == torch.bool else mask.double()
    return F.scaled_dot_product_attention(q.double(), k.double(), v.double(), **kw)


def close(got, want, atol=2e-5):
    got = torch.as_tensor(np.ascontiguousarray(got)) if isinstance(got, np.ndarray) else got
    np.testing.assert_allclose(got.double().numpy(), want.numpy(), rtol=0, atol=atol)
