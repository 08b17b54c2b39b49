"""The inputs mha_bench times a shape on, computed in NumPy bit for bit: the weights of
mha::weights::random (nn.Linear's initialisation drawn from Philox4x32-10, src/core/weights.cpp)
and x uniform in [-1, 1) from std::mt19937 (bench/check.cpp), with the seeds mha_bench uses, and
the rows its check samples. The peers run on exactly these, so their times and errors are for
the same problem as mha's; tools/tests/test_inputs.py pins every value to what mha_bench
itself writes (mha_bench --dump-inputs).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .problem import Shape

# mha_bench's seeds (bench/check.cpp).
WEIGHT_SEED = 42
INPUT_SEED = 7

_M0, _M1 = np.uint64(0xD2511F53), np.uint64(0xCD9E8D57)
_W0, _W1 = 0x9E3779B9, 0xBB67AE85
_LOW = np.uint64(0xFFFFFFFF)
_TENSOR_TAG = 0x6D686177  # 'mhaw', the fourth counter word of every weight


def philox4x32_10(counter: np.ndarray, key: tuple[int, int]) -> np.ndarray:
    """Philox4x32-10 of each column of `counter` ((4, n) uint32) with `key` (two 32-bit words),
    as mha::detail::philox4x32_10: (4, n) uint32."""
    c = [counter[i].astype(np.uint64) for i in range(4)]
    k0, k1 = key
    for round_ in range(10):
        if round_:
            k0, k1 = (k0 + _W0) & 0xFFFFFFFF, (k1 + _W1) & 0xFFFFFFFF
        p0, p1 = _M0 * c[0], _M1 * c[2]
        c = [(p1 >> 32) ^ c[1] ^ np.uint64(k0), p1 & _LOW, (p0 >> 32) ^ c[3] ^ np.uint64(k1), p0 & _LOW]
    return np.stack(c).astype(np.uint32)


def uniform_tensor(count: int, fan_in: int, seed: int, tensor: int) -> np.ndarray:
    """mha's fill_uniform: element n is word n % 4 of Philox((n/4, n >> 34, tensor, 'mhaw'),
    seed), its top 24 bits u in [0, 1), times 2, minus 1, times 1/sqrt(fan_in), in float32."""
    bound = np.float32(1.0) / np.sqrt(np.float32(fan_in))
    blocks = np.arange((count + 3) // 4, dtype=np.uint64)
    counter = np.stack(
        [
            (blocks & _LOW).astype(np.uint32),
            (blocks >> np.uint64(32)).astype(np.uint32),
            np.full(blocks.shape, tensor, np.uint32),
            np.full(blocks.shape, _TENSOR_TAG, np.uint32),
        ]
    )
    words = philox4x32_10(counter, (seed & 0xFFFFFFFF, seed >> 32)).T.reshape(-1)[:count]
    u = (words >> np.uint32(8)).astype(np.float32) * np.float32(2.0**-24)
    return (np.float32(2.0) * u - np.float32(1.0)) * bound


@dataclass
class Linear:
    """One nn.Linear: weight (out, in) and bias (out,) or None, float32."""

    weight: np.ndarray
    bias: np.ndarray | None


@dataclass
class Weights:
    """mha::weights: Q (d_out, d_in), K and V (d_kv, d_in), out_proj (d_out, d_out) or None."""

    query: Linear
    key: Linear
    value: Linear
    out_proj: Linear | None


def _linear(out: int, fan_in: int, bias: bool, seed: int, tensor_id: int) -> Linear:
    weight = uniform_tensor(out * fan_in, fan_in, seed, 2 * tensor_id).reshape(out, fan_in)
    return Linear(weight, uniform_tensor(out, fan_in, seed, 2 * tensor_id + 1) if bias else None)


def weights(s: Shape, seed: int = WEIGHT_SEED) -> Weights:
    """mha::weights::random(config of s, seed)."""
    d_kv = s.kv_heads * s.head_dim
    return Weights(
        _linear(s.d_out, s.d_in, s.qkv_bias, seed, 0),
        _linear(d_kv, s.d_in, s.qkv_bias, seed, 1),
        _linear(d_kv, s.d_in, s.qkv_bias, seed, 2),
        _linear(s.d_out, s.d_out, s.out_proj_bias, seed, 3) if s.out_proj else None,
    )


def mt19937_uint32(seed: int, count: int) -> np.ndarray:
    """The first `count` outputs of std::mt19937(seed) (NumPy's legacy seeding is the same
    init_genrand)."""
    generator = np.random.MT19937()
    generator._legacy_seeding(seed)
    return generator.random_raw(count).astype(np.uint32)


def x(s: Shape, seed: int = INPUT_SEED) -> np.ndarray:
    """(batch, seq_len, d_in) float32: std::uniform_real_distribution<float>(-1, 1) of
    std::mt19937(seed) as libstdc++ computes it: u = float(g) / 2^32 (generate_canonical<float,
    24>, below 1), then u * 2 - 1 in float."""
    count = s.batch * s.seq_len * s.d_in
    u = mt19937_uint32(seed, count).astype(np.float32) / np.float32(2.0**32)
    u = np.where(u >= 1, np.nextafter(np.float32(1), np.float32(0)), u)
    return (u * np.float32(2.0) + np.float32(-1.0)).reshape(s.batch, s.seq_len, s.d_in)


def sample_rows(batch: int, seq_len: int) -> list[tuple[int, int]]:
    """mha_bench's sampled rows (bench/check.cpp): (b, t) for b in {0, B-1} and t in {0, T/3,
    2T/3, T-1}, each once, in that order."""
    rows: list[tuple[int, int]] = []
    for b in (0, batch - 1):
        for t in (0, seq_len // 3, 2 * seq_len // 3, seq_len - 1):
            if (b, t) not in rows:
                rows.append((b, t))
    return rows
