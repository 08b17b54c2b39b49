"""mha.Plan on NumPy arrays and PyTorch tensors: the same outputs as the reference, no copies
where none is needed, decode through a cache, threads, and errors as Python exceptions with the
library's messages. The oracle is the naive backend (itself checked against PyTorch by the C++
and peers' suites) and, for modules, the PyTorch module itself."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import mha

torch = pytest.importorskip("torch")

CONFIG = mha.Config(d_in=48, d_out=32, n_heads=4, context_length=64, qkv_bias=True)


def split_weights(cfg: mha.Config, seed: int = 0) -> dict[str, np.ndarray]:
    """A state_dict in the split layout (the seeds' names) with random weights."""
    rng = np.random.default_rng(seed)
    d_kv = cfg.n_kv_heads * cfg.head_dim
    out: dict[str, np.ndarray] = {}
    for name, rows in (("W_query", cfg.d_out), ("W_key", d_kv), ("W_value", d_kv)):
        out[f"{name}.weight"] = rng.uniform(-0.2, 0.2, (rows, cfg.d_in)).astype(np.float32)
        if cfg.qkv_bias:
            out[f"{name}.bias"] = rng.uniform(-0.2, 0.2, rows).astype(np.float32)
    if cfg.out_proj:
        out["out_proj.weight"] = rng.uniform(-0.2, 0.2, (cfg.d_out, cfg.d_out)).astype(np.float32)
        if cfg.out_proj_bias:
            out["out_proj.bias"] = rng.uniform(-0.2, 0.2, cfg.d_out).astype(np.float32)
    return out


def inputs(batch: int, tokens: int, d_in: int, seed: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((batch, tokens, d_in)).astype(np.float32)


@pytest.fixture(scope="module")
def weights() -> dict[str, np.ndarray]:
    return split_weights(CONFIG)


@pytest.fixture(scope="module")
def reference(weights):
    return mha.Plan(CONFIG, weights, backend="naive")


def test_backends_list_every_backend_with_what_it_declines():
    names = [b.name for b in mha.backends()]
    assert names[-1] == "naive" and len(set(names)) == len(names)
    assert mha.default_backend().name in names
    for b in mha.backends():
        assert b.description and b.isa and b.max_threads >= 1
        declines = b.declines()
        assert set(declines) == {"grouped-query", "bf16", "decode", "window"}
        for feature, reasons in declines.items():
            assert set(reasons) <= {"wrapper", "split_weight", "fused_qkv"}
            assert all(reasons.values()), (b.name, feature)
        assert b.supports(CONFIG) is None  # every backend computes fp32 MHA
    naive = next(b for b in mha.backends() if b.name == "naive")
    assert naive.declines()["decode"] == {}


@pytest.mark.parametrize("backend", [b.name for b in mha.backends()])
@pytest.mark.parametrize("formulation", ["wrapper", "split_weight", "fused_qkv"])
def test_every_backend_and_formulation_computes_the_reference(weights, reference, backend, formulation):
    x = inputs(2, 17, CONFIG.d_in)
    want = reference(x)
    got = mha.Plan(CONFIG, weights, backend=backend, formulation=formulation)(x)
    assert got.shape == (2, 17, CONFIG.d_out) and got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-5 * np.abs(want).max())


def test_numpy_and_torch_inputs_give_the_same_output_in_their_own_kind(reference):
    x = inputs(1, 9, CONFIG.d_in)
    y_np = reference(x)
    y_torch = reference(torch.from_numpy(x))
    assert isinstance(y_np, np.ndarray) and isinstance(y_torch, torch.Tensor)
    assert y_torch.dtype == torch.float32
    np.testing.assert_array_equal(y_torch.numpy(), y_np)


def test_a_contiguous_float32_input_is_read_in_place_and_out_is_written_in_place(reference):
    from mha import _mha

    for x in (inputs(1, 5, CONFIG.d_in), torch.from_numpy(inputs(1, 5, CONFIG.d_in))):
        address = x.ctypes.data if isinstance(x, np.ndarray) else x.data_ptr()
        assert _mha._input_address(x) == address  # what run() reads: x's own memory
        out = (
            np.empty((1, 5, CONFIG.d_out), np.float32) if isinstance(x, np.ndarray) else torch.empty(1, 5, 32)
        )
        out_address = out.ctypes.data if isinstance(out, np.ndarray) else out.data_ptr()
        y = reference(x, out=out)
        assert y is out
        assert (y.ctypes.data if isinstance(y, np.ndarray) else y.data_ptr()) == out_address
        np.testing.assert_array_equal(np.asarray(out), np.asarray(reference(x)))


def test_a_strided_input_is_copied_and_gives_the_same_output(reference):
    from mha import _mha

    base = inputs(1, 7, 2 * CONFIG.d_in)
    x = base[:, :, ::2]  # every other feature: not contiguous
    assert _mha._input_address(x) != x.ctypes.data
    np.testing.assert_array_equal(reference(x), reference(np.ascontiguousarray(x)))
    t = torch.from_numpy(inputs(7, 1, CONFIG.d_in)).transpose(0, 1)  # (1, 7, d_in), strided
    np.testing.assert_array_equal(reference(t).numpy(), reference(t.contiguous()).numpy())


def test_decode_through_a_cache_gives_the_rows_of_the_full_pass(weights):
    x = inputs(2, 12, CONFIG.d_in)
    for backend in [b.name for b in mha.backends() if not b.declines()["decode"]]:
        plan = mha.Plan(CONFIG, weights, backend=backend)
        full = plan(x)
        cache = plan.make_cache(batch=2, capacity=12)
        assert cache.batch == 2 and cache.capacity == 12 and cache.precision == "fp32"
        assert cache.nbytes > 0
        steps = [plan(x[:, :5], cache=cache)] + [plan(x[:, t : t + 1], cache=cache) for t in range(5, 12)]
        assert cache.lengths == [12, 12]
        np.testing.assert_allclose(
            np.concatenate(steps, axis=1), full, rtol=0, atol=1e-5 * np.abs(full).max()
        )
        cache.reset(1)
        assert cache.lengths == [12, 0]
        with pytest.raises(mha.InvalidArgument, match="capacity"):
            plan(x[:, :1], cache=cache)  # sequence 0 is full


def test_a_cache_keeps_its_plan_alive(weights):
    cache = mha.Plan(CONFIG, weights).make_cache(1, 4)
    import gc

    gc.collect()
    assert cache.lengths == [0]  # the plan it belongs to still exists


def test_threads_give_bitwise_identical_results(weights):
    x = inputs(2, 33, CONFIG.d_in)
    for backend in ("tbb", "xsimd", "naive"):
        if backend not in [b.name for b in mha.backends()]:
            continue
        plan = mha.Plan(CONFIG, weights, backend=backend)
        np.testing.assert_array_equal(plan(x, threads=1), plan(x, threads=2))


def test_calls_from_several_python_threads_at_once(weights, reference):
    plan = mha.Plan(CONFIG, weights)
    xs = [inputs(1, 20, CONFIG.d_in, seed=s) for s in range(4)]
    results: dict[int, np.ndarray] = {}

    def work(i: int) -> None:
        for _ in range(5):
            results[i] = plan(xs[i], threads=1)

    workers = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    for i, x in enumerate(xs):
        np.testing.assert_array_equal(results[i], plan(x, threads=1))


def test_bf16_plans_take_and_return_bfloat16_tensors(weights):
    bf16 = mha.Config(d_in=48, d_out=32, n_heads=4, context_length=64, qkv_bias=True, precision="bf16")
    plan = mha.Plan(bf16, weights, backend="naive")
    x = torch.from_numpy(inputs(1, 6, 48))
    y32 = plan(x)
    y16 = plan(x.bfloat16())
    assert y16.dtype == torch.bfloat16
    np.testing.assert_allclose(
        y16.float().numpy(), plan(x.bfloat16().float()).numpy(), rtol=1 / 128, atol=1e-6
    )
    assert y32.dtype == torch.float32
    out = torch.empty(1, 6, 32, dtype=torch.bfloat16)
    assert plan(x.bfloat16(), out=out) is out
    with pytest.raises(mha.InvalidArgument, match="bfloat16 and the plan computes fp32"):
        mha.Plan(CONFIG, weights)(x.bfloat16())


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda p: p(inputs(1, 4, CONFIG.d_in).astype(np.float64)), "dtype float64, expected float32"),
        (lambda p: p(inputs(1, 4, CONFIG.d_in)[0]), r"shape \(4, 48\), expected \(batch, tokens, d_in=48\)"),
        (lambda p: p(inputs(1, 4, 40)), "40"),
        (lambda p: p(inputs(1, 65, CONFIG.d_in)), "context_length"),
        (lambda p: p([[[0.0] * 48]]), "x is a list, expected a numpy.ndarray or a torch.Tensor"),
        (lambda p: p(inputs(1, 4, 48), out=np.empty((1, 4, 32))), "out is a ndarray of dtype float64"),
        (lambda p: p(inputs(1, 4, 48), out=np.empty((1, 4, 31), np.float32)), "31"),
        (
            lambda p: p(inputs(1, 4, 48), out=np.empty((1, 32, 4), np.float32).transpose(0, 2, 1)),
            "C-contiguous",
        ),
        (lambda p: p(torch.ones(1, 4, 48, requires_grad=True)), "requires grad"),
        (lambda p: p(torch.ones(1, 4, 48, dtype=torch.float16)), "dtype torch.float16"),
        (lambda p: p(inputs(1, 4, 48), threads=-1), r"threads \(-1\)"),
        (lambda p: p.make_cache(0, 4), "batch"),
        (lambda p: p.make_cache(1, 65), "capacity"),
    ],
)
def test_bad_input_is_an_error_naming_the_value(reference, call, message):
    with pytest.raises(mha.InvalidArgument, match=message):
        call(reference)


def test_rope_scalings_read_from_their_problem_names():
    assert mha.RopeScaling.from_name("") == mha.RopeScaling()
    assert mha.RopeScaling.from_name("linear4") == mha.RopeScaling("linear", factor=4.0)
    assert mha.RopeScaling.from_name("llama3_8_1_4_8192") == mha.RopeScaling(
        "llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_context=8192
    )
    with pytest.raises(mha.InvalidArgument, match='rope scaling "yarn2" is not linear<factor>'):
        mha.RopeScaling.from_name("yarn2")


def test_library_errors_keep_their_kind_and_message(weights):
    assert issubclass(mha.InvalidArgument, ValueError) and issubclass(mha.InvalidArgument, mha.Error)
    assert issubclass(mha.Unsupported, mha.Error) and issubclass(mha.FormatError, mha.Error)
    with pytest.raises(mha.InvalidArgument, match=r"mha: d_out \(10\) must be divisible by n_heads \(3\)"):
        mha.Config(d_in=8, d_out=10, n_heads=3, context_length=4)
    with pytest.raises(mha.InvalidArgument, match="backend"):
        mha.Plan(CONFIG, weights, backend="no-such-backend")
    with pytest.raises(mha.InvalidArgument, match="formulation 'fused' is not one of"):
        mha.Plan(CONFIG, weights, formulation="fused")
    with pytest.raises(mha.InvalidArgument, match="the weights give d_in=48, the config says d_in=40"):
        mha.Plan(mha.Config(d_in=40, d_out=32, n_heads=4, context_length=64, qkv_bias=True), weights)
    bad = dict(weights)
    bad["W_key.weight"] = bad["W_key.weight"][:, :40]
    with pytest.raises(mha.FormatError, match="W_key.weight"):
        mha.Plan.from_state_dict(bad, n_heads=4, context_length=64)


def test_state_dicts_convert_the_block_alone_and_refuse_codes_and_empty_tensors(weights):
    # A whole model's state_dict with a prefix: only the block is converted; another block's
    # integer codes are never read, this block's are refused naming the tensor.
    model = {f"layers.0.attn.{k}": v for k, v in weights.items()}
    model["layers.1.attn.W_query.weight"] = np.ones((4, 4), np.int8)
    model["position_ids"] = torch.arange(8)
    x = inputs(1, 5, CONFIG.d_in)
    plan = mha.Plan.from_state_dict(model, n_heads=4, context_length=64, prefix="layers.0.attn")
    np.testing.assert_array_equal(plan(x), mha.Plan(CONFIG, weights)(x))
    with pytest.raises(mha.InvalidArgument, match=r"'layers.1.attn.W_query.weight'\] has dtype int8"):
        mha.Plan.from_state_dict(model, n_heads=4, context_length=64, prefix="layers.1.attn.")
    with pytest.raises(mha.InvalidArgument, match="prefixes 'layers.0.attn.' and 'layers.1.attn.'"):
        mha.Plan.from_state_dict(model, n_heads=4, context_length=64, prefix="layers.2.attn.")
    meta = {k: torch.empty(v.shape, device="meta") for k, v in weights.items()}
    with pytest.raises(mha.InvalidArgument, match="is on the meta device"):
        mha.Plan.from_state_dict(meta, n_heads=4, context_length=64)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (
            lambda w: mha.Plan.from_state_dict(w, n_heads=2**63, context_length=4),
            r"n_heads \(9223372036854775808\)",
        ),
        (lambda w: mha.Plan.from_state_dict(w, n_heads=4, context_length=-1), r"context_length \(-1\)"),
        (lambda w: mha.Plan.from_state_dict(w, n_heads=True, context_length=4), r"n_heads \(True\)"),
        (lambda w: mha.Plan(CONFIG, w).make_cache(1, 2**64), r"capacity \(18446744073709551616\)"),
    ],
)
def test_integer_arguments_out_of_range_are_named(weights, call, message):
    with pytest.raises(mha.InvalidArgument, match=message):
        call(weights)


def test_a_huge_context_costs_what_calls_use_and_a_cache_too_large_is_named(weights):
    # A rotary table sized to a context of 2^62 positions once crashed every backend.
    cfg = mha.Config(d_in=48, d_out=32, n_heads=4, context_length=2**62, qkv_bias=True, rope_base=1e4)
    small = mha.Config(d_in=48, d_out=32, n_heads=4, context_length=8, qkv_bias=True, rope_base=1e4)
    x = inputs(2, 7, CONFIG.d_in)
    for backend in mha.backends():
        np.testing.assert_array_equal(
            mha.Plan(cfg, weights, backend=backend.name)(x), mha.Plan(small, weights, backend=backend.name)(x)
        )
    with pytest.raises(
        mha.Error, match=r"a kv cache of 1 sequences of capacity 4398046511104 needs \d+ bytes"
    ):
        mha.Plan(cfg, weights).make_cache(1, 2**42)
