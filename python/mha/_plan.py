"""mha.Plan: a module prepared by one backend, called on arrays and tensors."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from typing import Any

import numpy as np

from . import _executor, _mha
from ._arguments import _count, _threads
from ._mha import Backend, Cache, Config, InvalidArgument, Unsupported
from ._modules import describe

_FORMULATIONS = ("wrapper", "split_weight", "fused_qkv")


def backends() -> list[Backend]:
    """Every backend built into this mha, best first (naive, the reference, last). Each has a
    name, a description, the ISA its kernels dispatch to here, max_threads, supports(config,
    formulation, past, kv_precision) (None, or why it declines) and declines() (the features
    `mha backends` asks about that it declines, and why)."""
    return _mha.backends()


def _config_with(cfg: Config, **changes: Any) -> Config:
    """cfg with some fields changed (validated again)."""
    fields = {
        name: getattr(cfg, name)
        for name in (
            "d_in",
            "d_out",
            "n_heads",
            "context_length",
            "causal",
            "qkv_bias",
            "out_proj",
            "out_proj_bias",
            "dropout",
            "n_kv_heads",
            "precision",
            "rope_base",
            "rope_scaling",
            "window",
            "softcap",
            "sinks",
            "out_features",
            "qk_norm",
            "qk_norm_eps",
        )
    }
    fields.update(changes)
    return Config(**fields)


def _float32_tensors(state_dict: Mapping[str, Any], prefix: str = "") -> dict[str, np.ndarray]:
    """A state_dict's tensors (NumPy arrays or PyTorch tensors of a floating dtype, or bool masks)
    as float32 arrays in C order: copies only where the dtype or the layout differs. With a
    prefix, only the block's tensors are converted; the others keep their names (which say where
    the blocks are) over empty arrays, so a whole model's state_dict costs one block. An integer
    or complex tensor in the block, or one without data (the meta device), is an InvalidArgument
    naming it: mha would otherwise read quantised codes as weights."""
    block = prefix if not prefix or prefix.endswith(".") else prefix + "."
    torch = sys.modules.get("torch")
    out = {}
    for name, value in state_dict.items():
        if not isinstance(name, str):
            raise InvalidArgument(f"mha: state_dict key {name!r} is not a string")
        if isinstance(value, np.ndarray):
            kind = value.dtype.kind
        elif torch is not None and isinstance(value, torch.Tensor):
            kind = "b" if value.dtype == torch.bool else "f" if value.dtype.is_floating_point else "i"
        else:
            raise InvalidArgument(
                f"mha: state_dict[{name!r}] is a {type(value).__name__}, expected a NumPy "
                "array or a PyTorch tensor"
            )
        if not name.startswith(block):
            out[name] = np.empty(0, np.float32)
            continue
        if kind not in "fb":
            raise InvalidArgument(
                f"mha: state_dict[{name!r}] has dtype {value.dtype}, expected a floating-point "
                "tensor (mha reads weights as numbers, not quantised codes)"
            )
        if not isinstance(value, np.ndarray):
            if value.device.type == "meta":
                raise InvalidArgument(f"mha: state_dict[{name!r}] is on the meta device: it holds no data")
            value = value.detach().to("cpu", torch.float32).contiguous().numpy()
        out[name] = np.ascontiguousarray(value, dtype=np.float32)
    return out


class Plan:
    """A module prepared by one backend in one formulation: call it on (batch, tokens, d_in)
    float32 inputs (bf16 PyTorch tensors too, for a bf16 plan).

    Made from a config and its weights (Plan(config, state_dict)), a state_dict in any layout mha
    reads (from_state_dict), a safetensors file (from_safetensors), a Hugging Face model folder
    (from_pretrained) or a PyTorch module (from_module). `backend` is a name of mha.backends()
    (None: the best, or the environment variable MHA_BACKEND's); `formulation` is wrapper,
    split_weight or fused_qkv; `threads` the default worker threads of a call (0: all cores, at
    most 1024: include/mha/run_options.hpp's max_run_threads); `executor` (an attribute, or per
    call) who runs the tbb backend's parallel work: "tbb", "openmp", "serial", or None (the
    default: PyTorch's OpenMP pool where PyTorch is loaded, else oneTBB; mha.default_executor()).
    A plan is immutable and may be called from several threads at once (each with its own cache).
    """

    __slots__ = ("_plan", "threads", "executor", "_context_source", "_no_decode")

    def __init__(
        self,
        config: Config,
        weights: Mapping[str, Any],
        *,
        backend: str | None = None,
        formulation: str = "split_weight",
        threads: int = 0,
    ) -> None:
        """config and its weights: a state_dict in any layout mha reads (docs/cli.md, "Weight
        files"), whose shapes and biases must be the config's; the config gives what a
        state_dict does not say (causal, precision, dropout, the rotary embedding, the context
        length)."""
        module = _mha._from_state_dict(
            _float32_tensors(weights), {}, config.n_heads, config.n_kv_heads, config.rope_base, 0, ""
        )
        loaded = module.config
        for name in (
            "d_in",
            "d_out",
            "n_heads",
            "n_kv_heads",
            "qkv_bias",
            "out_proj",
            "out_proj_bias",
            "out_features",
            "qk_norm",
            "sinks",
        ):
            if getattr(loaded, name) != getattr(config, name):
                raise InvalidArgument(
                    f"mha: the weights give {name}={getattr(loaded, name)}, the config says "
                    f"{name}={getattr(config, name)}"
                )
        if loaded.context_length and config.context_length > loaded.context_length:
            raise InvalidArgument(
                f"mha: the config's context_length ({config.context_length}) exceeds the weights' "
                f"causal mask ({loaded.context_length} tokens)"
            )
        module.config = config
        self._init(module, backend, formulation, threads)

    def _init(
        self, module: Any, backend: str | None, formulation: str, threads: int, context_source: str = ""
    ) -> None:
        if formulation not in _FORMULATIONS:
            raise InvalidArgument(
                f"mha: formulation {formulation!r} is not one of {', '.join(_FORMULATIONS)}"
            )
        self.threads = _check_threads(threads)
        self.executor: str | None = None
        _check_name("backend", backend)
        self._plan = module.prepare(backend, formulation)
        # Where the context length comes from (a model's max_position_embeddings or sliding
        # window), for messages about longer inputs.
        self._context_source = context_source or module.context_source
        # An encoder's attention (BERT's layout, not causal) sees the whole sequence: a cache,
        # which feeds it a few tokens at a time, would compute something else.
        self._no_decode = (
            f"the module is an encoder's attention ({module.layout} layout, not causal): each token "
            "sees the whole sequence, so it has no decode; call the plan on whole sequences"
            if module.layout == "bert" and not module.config.causal
            else ""
        )

    @classmethod
    def _of(
        cls, module: Any, backend: str | None, formulation: str, threads: int, context_source: str = ""
    ) -> Plan:
        plan = cls.__new__(cls)
        plan._init(module, backend, formulation, threads, context_source)
        return plan

    @classmethod
    def from_state_dict(
        cls,
        state_dict: Mapping[str, Any],
        *,
        n_heads: int = 0,
        n_kv_heads: int = 0,
        rope_base: float | None = None,
        rope_scaling: _mha.RopeScaling | None = None,
        context_length: int = 0,
        prefix: str = "",
        metadata: Mapping[str, str] | None = None,
        causal: bool | None = None,
        precision: str = "fp32",
        backend: str | None = None,
        formulation: str = "split_weight",
        threads: int = 0,
    ) -> Plan:
        """A state_dict (a module's, or a whole model's with `prefix` naming one attention
        block) in any layout mha reads: the layout is detected from the names. What the tensors
        do not say comes from the arguments or `metadata` (the safetensors metadata mha writes:
        num_heads, num_kv_heads, rope_base, context_length): H, the K/V heads, the rotary
        embedding, the context length (0: the causal mask buffer's). causal=None keeps the
        layout's (False for BERT's, True otherwise)."""
        module = _mha._from_state_dict(
            _float32_tensors(state_dict, prefix),
            {str(k): str(v) for k, v in (metadata or {}).items()},
            _count("n_heads", n_heads),
            _count("n_kv_heads", n_kv_heads),
            rope_base,
            _count("context_length", context_length),
            prefix,
        )
        return cls._of(
            _finish(module, precision, causal=causal, rope_scaling=rope_scaling),
            backend,
            formulation,
            threads,
        )

    @classmethod
    def from_safetensors(
        cls,
        path: str | os.PathLike[str],
        *,
        n_heads: int = 0,
        n_kv_heads: int = 0,
        rope_base: float | None = None,
        context_length: int = 0,
        prefix: str = "",
        causal: bool | None = None,
        precision: str = "fp32",
        backend: str | None = None,
        formulation: str = "split_weight",
        threads: int = 0,
    ) -> Plan:
        """A safetensors file holding a state_dict, as from_state_dict; with a prefix only that
        block's tensors are read."""
        module = _mha._from_safetensors(
            os.fspath(path),
            _count("n_heads", n_heads),
            _count("n_kv_heads", n_kv_heads),
            rope_base,
            _count("context_length", context_length),
            prefix,
        )
        return cls._of(_finish(module, precision, causal=causal), backend, formulation, threads)

    @classmethod
    def from_pretrained(
        cls,
        path: str | os.PathLike[str],
        layer: int,
        *,
        context_length: int = 0,
        precision: str = "fp32",
        backend: str | None = None,
        formulation: str = "split_weight",
        threads: int = 0,
    ) -> Plan:
        """Layer `layer`'s attention block of the Hugging Face model folder `path`
        (save_pretrained's output or a cache snapshot; one safetensors file or shards): its
        config.json gives the heads, K/V heads, rotary embedding, causality and context length
        (max_position_embeddings, or a smaller context_length), and only that block's tensors
        are read. Model types: gpt2, llama, mistral, qwen2, gemma2, gemma3_text, gpt_oss, bert, roberta,
        xlm-roberta."""
        module = _mha._from_pretrained(
            os.fspath(path), _count("layer", layer, -(2**63)), _count("context_length", context_length)
        )
        return cls._of(_finish(module, precision), backend, formulation, threads)

    @classmethod
    def from_module(
        cls,
        module: Any,
        *,
        context_length: int | None = None,
        rope_base: float | None = None,
        causal: bool | None = None,
        precision: str = "fp32",
        backend: str | None = None,
        formulation: str = "split_weight",
        threads: int = 0,
    ) -> Plan:
        """A live PyTorch module: torch.nn.MultiheadAttention (context_length needed: it records
        none; causal unless causal=False), the seeds' MultiHeadAttention,
        MultiHeadAttentionWrapper and GroupedQueryAttention (rope_base needed: it keeps only
        its tables), or Hugging Face's GPT2Attention, LlamaAttention (Mistral's and Qwen2's
        alike) and BertSelfAttention. Its weights are copied into the plan (a later change to
        the module does not reach it); mha.torch.Attention wraps a module as a drop-in."""
        d = describe(module, context_length=context_length, rope_base=rope_base)
        return cls._from_description(d, causal, precision, backend, formulation, threads)

    @classmethod
    def _from_description(
        cls, d: Any, causal: bool | None, precision: str, backend: str | None, formulation: str, threads: int
    ) -> Plan:
        """from_module's plan, from the module's description (mha._modules.describe)."""
        loaded = _mha._from_state_dict(
            _float32_tensors(d.state_dict),
            {},
            d.n_heads,
            d.n_kv_heads,
            d.rope_base,
            d.context_length,
            "",
        )
        finished = _finish(
            loaded,
            precision,
            causal=d.causal if causal is None else causal,
            dropout=d.dropout,
            rope_scaling=d.rope_scaling,
            window=d.window or None,
            qk_norm_eps=d.qk_norm_eps,
            softcap=d.softcap or None,
        )
        return cls._of(finished, backend, formulation, threads, d.context_source)

    @property
    def config(self) -> Config:
        return self._plan.config

    @property
    def formulation(self) -> str:
        return self._plan.formulation

    @property
    def backend(self) -> str:
        """The name of the backend that prepared it."""
        return self._plan.backend

    def make_cache(self, batch: int, capacity: int, precision: str | None = None) -> Cache:
        """An empty KV cache for `batch` sequences of up to `capacity` tokens (<= the context
        length), its memory allocated now, keeping keys and values in `precision` (None: the
        plan's; "int8": 8-bit codes with a scale and zero per row). It belongs to this plan."""
        if self._no_decode:
            raise Unsupported(f"mha: {self._no_decode}")
        batch, capacity = _count("batch", batch, -(2**63)), _count("capacity", capacity, -(2**63))
        _check_name("precision", precision)
        self._check_length("capacity", capacity)
        return self._plan.make_cache(batch, capacity, precision)

    def _check_length(self, what: str, tokens: Any) -> None:
        """InvalidArgument naming where the context length comes from, when `tokens` exceed it and
        the plan knows (a model's config); the library's own check covers the rest."""
        limit = self._plan.config.context_length
        if self._context_source and isinstance(tokens, int) and tokens > limit:
            raise InvalidArgument(
                f"mha: {what} {tokens} is more than the plan's context_length {limit} ({self._context_source})"
            )

    def __call__(
        self,
        x: Any,
        *,
        out: Any = None,
        cache: Cache | None = None,
        threads: int | None = None,
        executor: str | None = None,
    ) -> Any:
        """y = the module on x: (batch, tokens, d_in), a NumPy array or a PyTorch CPU tensor,
        float32 (bfloat16 tensors for a bf16 plan: converted to float32 and back, copies).
        Read where it lies when C-contiguous, else copied into that layout first. The output
        (batch, tokens, config.out_width) goes into `out` (the input's kind, float32, C-contiguous; its
        memory is written, never a copy's), else into a new array or tensor, returned.

        With `cache` (make_cache's), x holds the next tokens of each sequence: their keys and
        values are appended and y holds their rows of the forward pass over everything the
        sequence has seen (decode). Under autograd a tensor is refused (mha computes inference
        only). threads and executor: this call's, else the plan's."""
        threads = self.threads if threads is None else _check_threads(threads)
        on = _executor.resolve(self.executor if executor is None else executor, threads)
        if type(x) is np.ndarray:
            if x.dtype != np.float32:
                raise InvalidArgument(f"mha: x has dtype {x.dtype}, expected float32")
            if x.ndim != 3:
                raise _rank_error("x", x.shape, self._plan.config.d_in)
            if out is None:
                out = np.empty((x.shape[0], x.shape[1], self._plan.config.out_width), np.float32)
            elif type(out) is not np.ndarray or out.dtype != np.float32 or not out.flags.c_contiguous:
                raise _out_error(out, "a C-contiguous float32 numpy.ndarray")
            elif not out.flags.writeable:
                raise InvalidArgument("mha: out is read-only")
            self._run(x, out, cache, on)
            return out
        torch = sys.modules.get("torch")
        if torch is None or not isinstance(x, torch.Tensor):
            raise InvalidArgument(
                f"mha: x is a {type(x).__name__}, expected a numpy.ndarray or a torch.Tensor"
            )
        return self._call_torch(torch, x, out, cache, on)

    def _call_torch(self, torch: Any, x: Any, out: Any, cache: Cache | None, on: tuple) -> Any:
        if x.device.type != "cpu":
            raise InvalidArgument(f"mha: x is on {x.device}, expected the CPU")
        if x.requires_grad and torch.is_grad_enabled():
            raise InvalidArgument(
                "mha: x requires grad: mha computes inference only (no backward); call it under "
                "torch.no_grad() or torch.inference_mode(), or pass x.detach()"
            )
        if x.ndim != 3:
            raise _rank_error("x", tuple(x.shape), self._plan.config.d_in)
        bf16 = x.dtype == torch.bfloat16
        if bf16 and self._plan.config.precision != "bf16":
            raise InvalidArgument(
                "mha: x is bfloat16 and the plan computes fp32: pass float32, or make a bf16 plan"
            )
        if x.dtype != torch.float32 and not bf16:
            raise InvalidArgument(
                f"mha: x has dtype {x.dtype}, expected torch.float32"
                + (" (or torch.bfloat16: the plan is bf16)" if self._plan.config.precision == "bf16" else "")
            )
        shape = (x.shape[0], x.shape[1], self._plan.config.out_width)
        want = torch.bfloat16 if bf16 else torch.float32
        if out is not None and (
            not isinstance(out, torch.Tensor)
            or out.dtype != want
            or out.device.type != "cpu"
            or not out.is_contiguous()
            or out.requires_grad
        ):
            raise _out_error(out, f"a contiguous {want} CPU torch.Tensor not requiring grad")
        if out is not None and out.is_inference() and not torch.is_inference_mode_enabled():
            raise InvalidArgument(
                "mha: out is an inference tensor (made under torch.inference_mode()) and the call is "
                "outside inference mode, where torch refuses in-place writes to one: pass out.clone(), "
                "or call under torch.inference_mode()"
            )
        x = x.detach()
        if bf16:
            y = torch.empty(shape, dtype=torch.float32)
            self._run(x.float(), y, cache, on)
            if out is None:
                return y.to(torch.bfloat16)
            return out.copy_(y)
        # x's memory (and out's) held for the call: another thread's set_() frees it only after.
        held = [x.untyped_storage()]
        if out is None:
            out = torch.empty(shape, dtype=torch.float32)
        else:
            held.append(out.untyped_storage())
        self._run(x, out, cache, on)
        if len(held) > 1:  # the caller's out, written in place: autograd sees the write
            torch.autograd.graph.increment_version(out)
        return out

    def _run(self, x: Any, out: Any, cache: Cache | None, on: tuple[str | None, int]) -> None:
        """on: the executor and threads (_executor.resolve's)."""
        executor, threads = on
        if cache is None:
            self._check_length("x's tokens", int(x.shape[1]))
            self._plan.run(x, out, threads, executor)
        else:
            self._plan.run_cache(x, out, cache, threads, executor)

    def __repr__(self) -> str:
        executor = self.executor or f"auto, now {_executor.default().split(':')[0]}"
        return f"mha.Plan({self.backend}, {self.formulation}, {self.config!r}, executor={executor})"


def _finish(module: Any, precision: str, **changes: Any) -> Any:
    """The loaded module with what the caller says of it that the weights do not: its precision,
    and each of `changes` not None (causal, dropout, rope_scaling, window)."""
    if module.config.context_length == 0:
        raise InvalidArgument(
            "mha: the weights record no context length (no causal mask buffer or metadata): pass context_length="
        )
    _check_name("precision", precision)
    given = {name: value for name, value in changes.items() if value is not None}
    module.config = _config_with(module.config, precision=precision, **given)
    return module


def _check_threads(threads: int) -> int:
    """threads in [0, max_run_threads] (0: all cores), checked when a plan is made or called."""
    return _threads("mha", threads)


def _check_name(what: str, value: Any) -> None:
    """A name argument the library parses (a backend, a precision): a str, or None."""
    if value is not None and not isinstance(value, str):
        raise InvalidArgument(f"mha: {what} {value!r} must be a name (a str), or None")


def _rank_error(name: str, shape: tuple[int, ...], d_in: int) -> InvalidArgument:
    return InvalidArgument(f"mha: {name} has shape {tuple(shape)}, expected (batch, tokens, d_in={d_in})")


def _out_error(out: Any, expected: str) -> InvalidArgument:
    dtype = getattr(out, "dtype", None)
    return InvalidArgument(f"mha: out is a {type(out).__name__} of dtype {dtype}, expected {expected}")
