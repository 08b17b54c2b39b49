"""mhapy.models.simulated_caches: each format's codes as it defines them (a row's error within half a
step, a constant row exact, the Hadamard rotation its own inverse), the per-channel keys' groups
filled and rewritten as tokens arrive, and the formats ranked on a tiny random Gemma 3 as their
bits say (8-bit nearer sdpa than 4-bit). Needs torch and transformers (the peers' environment).
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="needs torch (the peers' environment: build/peers-venv)")
transformers = pytest.importorskip("transformers", reason="needs transformers (the peers' environment)")

from mhapy.models import accuracy as ma  # noqa: E402
from mhapy.models import simulated_caches as sc  # noqa: E402


def test_a_rows_codes_are_within_half_a_step():
    x = torch.randn(2, 3, 7, 64, generator=torch.Generator().manual_seed(1)) * torch.linspace(0.1, 10, 64)
    for bits in (4, 8):
        got = sc.by_token(x, bits, 0)
        step = (x.amax(-1, keepdim=True) - x.amin(-1, keepdim=True)) / ((1 << bits) - 1)
        assert ((got - x).abs() <= step / 2 + 1e-5).all()
        assert len(torch.unique(got[0, 0, 0])) <= 1 << bits
    grouped = sc.by_token(x, 4, 16)
    assert len(torch.unique(grouped[0, 0, 0, :16])) <= 16
    assert (grouped - x).abs().mean() < (sc.by_token(x, 4, 0) - x).abs().mean()  # finer groups
    constant = torch.full((1, 1, 1, 64), 3.25)
    assert torch.equal(sc.by_token(constant, 4, 0), constant)


def test_the_hadamard_rotation_is_its_own_inverse():
    h = sc.hadamard(256)
    assert torch.allclose(h @ h, torch.eye(256), atol=1e-5)
    with pytest.raises(ValueError, match="power of 2"):
        sc.hadamard(96)


@pytest.fixture(scope="module")
def model():
    torch.set_num_threads(1)
    config = transformers.Gemma3TextConfig(
        vocab_size=320,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=1,
        head_dim=16,
        sliding_window=8,
        layer_types=["sliding_attention", "full_attention"],
        max_position_embeddings=512,
        initializer_range=0.3,
    )
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(config, attn_implementation="sdpa").eval()


def test_channel_keys_wait_at_full_precision_until_their_group_fills(model):
    """A prefill of 150 tokens: two groups of 64 coded per channel, 22 rows exact; 42 more
    tokens fill the third group, whose rows are then rewritten with their codes."""
    cache = sc.simulated_cache(model, "sim_int4_channel")
    keys = torch.randn(1, 1, 150, 16, generator=torch.Generator().manual_seed(2)) * torch.linspace(0.1, 5, 16)
    got, _ = cache.update(keys, keys, 1)
    assert torch.equal(got[..., 128:, :], keys[..., 128:, :])
    for g in range(2):
        group = got[..., 64 * g : 64 * (g + 1), :]
        assert not torch.equal(group, keys[..., 64 * g : 64 * (g + 1), :])
        assert torch.equal(group, sc.rounded(keys[..., 64 * g : 64 * (g + 1), :], 4, -2))
    more = torch.randn(1, 1, 42, 16, generator=torch.Generator().manual_seed(3))
    for i in range(42):
        got, _ = cache.update(more[..., i : i + 1, :], more[..., i : i + 1, :], 1)
    third = torch.cat([keys[..., 128:, :], more], dim=-2)
    assert torch.equal(got[..., 128:192, :], sc.rounded(third, 4, -2))
    assert cache.pending[1].shape[-2] == 0


def test_the_formats_rank_by_their_bits(model):
    ids = torch.randint(0, 320, (120,), generator=torch.Generator().manual_seed(3))
    records = ma.evaluate(model, ids, caches=list(sc.FORMATS), prefill=96, positions=16)
    kl = {r["cache"]: r["kl_mean"] for r in records if r["measure"] == "kl"}
    assert set(kl) >= set(sc.FORMATS)
    assert 0 < kl["sim_int8"] < kl["sim_k8v4"]
    assert kl["sim_int8"] < min(
        kl[name] for name in ("sim_int4_token", "sim_int4_channel", "sim_int4_hadamard")
    )
    with pytest.raises(ValueError, match="expected one of"):
        sc.simulated_cache(model, "sim_int3")
