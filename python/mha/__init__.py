"""mha: causal multi-head attention on CPUs, from Python.

The C++ library's backends (naive, xsimd, oneDNN, TBB) on NumPy arrays and PyTorch CPU tensors:

    import mha
    plan = mha.Plan.from_pretrained("gpt2-folder", layer=0)   # or from_module, from_state_dict
    y = plan(x)                                               # x: (batch, tokens, d_in) float32
    cache = plan.make_cache(batch=1, capacity=1024)
    y_step = plan(x_step, cache=cache)                        # decode through a KV cache

A plan reads a contiguous float32 input where it lies and writes its output into `out=` when
given (else into a new array or tensor of the input's kind), with the GIL released while it runs.
Errors are the library's: mha.InvalidArgument (also a ValueError), mha.Unsupported and
mha.FormatError, all mha.Error. `mha.torch.Attention(module)` runs a PyTorch attention module
through mha; `mha.attention(q, k, v, ...)` is F.scaled_dot_product_attention on mha's kernels, and
`import mha.transformers` lets Hugging Face models run on them (attn_implementation="mha").
docs/python.md has more.
"""

from ._mha import (
    Backend,
    Cache,
    Config,
    Error,
    FormatError,
    InvalidArgument,
    RopeScaling,
    Unsupported,
    default_backend,
)
from ._attention import attention
from ._cache import AttentionCache
from ._executor import default as default_executor
from ._plan import Plan, backends

__all__ = [
    "AttentionCache",
    "Backend",
    "Cache",
    "Config",
    "Error",
    "FormatError",
    "InvalidArgument",
    "Plan",
    "RopeScaling",
    "Unsupported",
    "attention",
    "backends",
    "default_backend",
    "default_executor",
]
