"""OpenVINO through optimum-intel, the whole-model peer of mhapy.models.bench: the path CPU users
of Hugging Face models take (OVModelForCausalLM: the model exported to OpenVINO, stateful, its KV
cache inside the compiled model in the precision the runtime picks).

optimum-intel requires an older transformers than the peers' environment pins, so it runs in its
own environment (scripts/peers-env.sh optimum) as a subprocess that models_bench starts once per
model and precision (OpenVinoRuns below): one JSON request a line on its stdin, one JSON reply a
line on its stdout, tensors through .npy files. It exports the folder models_bench saved (the
same weights: `load_in_8bit=False`, since optimum-intel would otherwise store the weights of a
model of 1B parameters or more in int8), then compiles it per thread count and KV precision.

    <optimum python> -m mhapy.models.openvino      (serves requests; models_bench starts it)

Requests (each reply is a JSON object; {"error": why} where a request fails):
  load      folder            export the model: {"export_s"}
  compile   threads, kv,      compile it on `threads` threads, computing in `precision` (the
            precision         model's: "f32" or "bf16", as the attention peer pins it; left to
                              OpenVINO, an fp32 model computes in bf16 where the CPU has AMX)
                              with the KV cache in kv ("" its default, else an OpenVINO element
                              type such as "u8"): the precisions the compiled model reports
  run       ids, steps, ...   a prefill of the token ids in the .npy file `ids` (batch, tokens),
                              timed (ttft_s), then `steps` greedy decode steps timed together
                              (decode_tokens_per_s), or steps fed the tokens of the .npy `feed`;
                              the process's peak RSS over both (peak_rss_bytes) and the cache's
                              bytes computed from its reported precision (cache_bytes); `busy`:
                              the threads busy during decode instead of timing; `logits`: writes
                              the logits predicting each decode token (batch, steps + 1, vocab)
                              to that .npy; `prefill_logits`: every prefill position's logits
                              (batch, tokens, vocab) to that one

Standard library at import: models_bench imports this module in the peers' environment for
OpenVinoRuns (which needs torch and numpy there); the server's imports (optimum-intel) happen
where it serves.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import IO, Any

# The bytes of one element of a KV cache per precision OpenVINO reports; u8/i8 rows also keep a
# scale and a zero point (two f32) per group of head_dim elements (the group size it reports; 0:
# one group per head).
_ELEMENT_BYTES = {"f32": 4, "f16": 2, "bf16": 2, "u8": 1, "i8": 1, "u4": 0.5, "i4": 0.5}

# The implementations models_bench names, and the KV_CACHE_PRECISION each asks for ("": none,
# the precision OpenVINO picks on this CPU).
IMPLEMENTATIONS = {"openvino": "", "openvino_u8": "u8"}
ROOT = Path(__file__).resolve().parents[3]
DEFAULT_PYTHON = os.environ.get("MHA_OPTIMUM_PYTHON") or str(
    ROOT / "build" / "peers-optimum-venv" / "bin" / "python"
)


def cache_bytes(config: dict, batch: int, tokens: int, parts: list[tuple[str, int]]) -> int:
    """The bytes of a KV cache of `tokens` tokens per sequence: layers x batch x K/V heads x
    tokens rows of head_dim elements for each of K and V, `parts` their (precision, group):
    OpenVINO's precision name ("u8", "f16", ...) and, for 8-bit and 4-bit codes, the elements
    that share a scale and a zero point (f32 each; 0: the whole row)."""
    layers = config.get("num_hidden_layers") or config["n_layer"]
    heads = config.get("num_attention_heads") or config["n_head"]
    kv_heads = config.get("num_key_value_heads") or heads
    hidden = config.get("hidden_size") or config["n_embd"]
    head_dim = config.get("head_dim") or hidden // heads
    row = 0.0
    for precision, group in parts:
        if precision not in _ELEMENT_BYTES:
            raise ValueError(f"KV cache precision {precision!r}: expected one of {', '.join(_ELEMENT_BYTES)}")
        row += head_dim * _ELEMENT_BYTES[precision]
        if _ELEMENT_BYTES[precision] <= 1:
            row += 8 * (-(-head_dim // group) if group else 1)
    return int(layers * batch * kv_heads * tokens * row)


def _precision_name(value: Any) -> str:
    """OpenVINO's short name of an element type ("u8", "f16"), from its Type or string."""
    name = str(getattr(value, "get_type_name", lambda: value)())
    return {"float32": "f32", "float16": "f16", "bfloat16": "bf16", "uint8": "u8", "int8": "i8"}.get(
        name, name
    )


class Server:
    """The subprocess's side: one exported model, compiled per request."""

    def __init__(self) -> None:
        self.model: Any = None
        self.config: dict = {}
        self.kv: list[tuple[str, int]] = []

    def load(self, folder: str) -> dict:
        from optimum.intel import OVModelForCausalLM

        begin = time.perf_counter()
        self.model = OVModelForCausalLM.from_pretrained(
            folder, export=True, load_in_8bit=False, compile=False, ov_config={"CACHE_DIR": ""}
        )
        self.config = json.loads((Path(folder) / "config.json").read_text())
        return {"export_s": time.perf_counter() - begin, "stateful": bool(self.model.stateful)}

    def compile(self, threads: int, kv: str, precision: str) -> dict:
        if self.model is None:
            raise RuntimeError("compile before load: no model")
        config = {
            "CACHE_DIR": "",
            "PERFORMANCE_HINT": "LATENCY",
            "INFERENCE_NUM_THREADS": int(threads),
            "INFERENCE_PRECISION_HINT": precision,
        }
        if kv:
            config["KV_CACHE_PRECISION"] = kv
        self.model.ov_config = config
        self.model.clear_requests()
        self.model.compile()
        compiled = self.model.request.get_compiled_model()
        # K's and V's precision and group size: (precision, group) each.
        self.kv = [
            (
                _precision_name(compiled.get_property(f"{part}_CACHE_PRECISION")),
                int(compiled.get_property(f"{part}_CACHE_GROUP_SIZE")),
            )
            for part in ("KEY", "VALUE")
        ]
        return {
            "kv_precision": self.kv[0][0],
            "value_precision": self.kv[1][0],
            "kv_group": self.kv[0][1],
            "inference_precision": _precision_name(compiled.get_property("INFERENCE_PRECISION_HINT")),
            "threads": int(compiled.get_property("INFERENCE_NUM_THREADS")),
        }

    def run(
        self,
        ids: str,
        steps: int,
        feed: str | None = None,
        busy: bool = False,
        logits: str | None = None,
        prefill_logits: str | None = None,
    ) -> dict:
        if self.model is None or self.model.request is None:
            raise RuntimeError("run before compile: no compiled model")
        import numpy as np
        import torch

        from .busy_threads import BusyThreads
        from ..peak_rss import peak_rss_bytes, reset_peak_rss

        prompt = torch.from_numpy(np.load(ids))
        fed = torch.from_numpy(np.load(feed)) if feed else None
        batch, seen = prompt.shape
        kept = []
        reset_peak_rss()
        begin = time.perf_counter()
        out = self.model(prompt, attention_mask=torch.ones_like(prompt))
        ttft = time.perf_counter() - begin
        if prefill_logits:
            np.save(prefill_logits, out.logits.float().numpy())
        last, past = out.logits[:, -1:], out.past_key_values
        kept.append(last)
        sampler = BusyThreads() if busy else contextlib.nullcontext()
        with sampler:
            begin = time.perf_counter()
            for i in range(steps):
                token = last.argmax(-1) if fed is None else fed[:, i : i + 1]
                seen += 1
                out = self.model(
                    token, attention_mask=torch.ones(batch, seen, dtype=torch.long), past_key_values=past
                )
                last, past = out.logits[:, -1:], out.past_key_values
                if logits:
                    kept.append(last)
            decode_s = max(time.perf_counter() - begin, 1e-9)
        if isinstance(sampler, BusyThreads):
            return {"decode_busy_threads": sampler.mean, "decode_busy_threads_most": sampler.most}
        if logits:
            np.save(logits, torch.cat(kept, dim=1).float().numpy())
        reply = {
            "ttft_s": ttft,
            "peak_rss_bytes": peak_rss_bytes(),
            "cache_bytes": cache_bytes(self.config, batch, seen, self.kv),
        }
        if steps:
            reply["decode_tokens_per_s"] = batch * steps / decode_s
        return reply


def serve(requests: IO[str], replies: IO[str]) -> None:
    """Answers each request line of `requests` with one line on `replies`."""
    server = Server()
    ops = {"load": server.load, "compile": server.compile, "run": server.run}
    for line in requests:
        try:
            request = json.loads(line)
            op = request.pop("op")
            if op not in ops:
                raise ValueError(f"op {op!r}: expected one of {', '.join(ops)}")
            reply = ops[op](**request)
        except Exception as e:  # a failed request is the client's to report, the server goes on
            reply = {"error": f"{type(e).__name__}: {e}"}
        replies.write(json.dumps(reply) + "\n")
        replies.flush()


class OpenVinoRuns:
    """models_bench's side: the OpenVINO implementations (IMPLEMENTATIONS) of one model in one
    precision. The model is saved to a temporary folder and served by this module in its own
    environment's process (`python`), compiled for an implementation's KV precision and torch's
    thread count when one is asked for; token ids and logits pass through .npy files in the
    same folder. Raises RuntimeError naming what failed (the environment missing, the export,
    a request)."""

    def __init__(self, model: Any, python: str = DEFAULT_PYTHON) -> None:
        import tempfile

        if not Path(python).is_file():
            raise RuntimeError(
                f"no optimum-intel environment: {python} does not exist (scripts/peers-env.sh optimum makes it)"
            )
        self.folder = tempfile.TemporaryDirectory(prefix="mha-models-openvino-")
        model.save_pretrained(self.folder.name)
        self.process = subprocess.Popen(
            [python, "-m", "mhapy.models.openvino"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=dict(os.environ, PYTHONPATH=str(ROOT / "tools")),
        )
        self.compiled: tuple = ()
        self.precisions: dict = {}
        self.precision = _precision_name(str(model.dtype).removeprefix("torch."))
        self._ask(op="load", folder=self.folder.name)

    def _ask(self, **request: Any) -> dict:
        assert self.process.stdin and self.process.stdout
        try:
            self.process.stdin.write(json.dumps(request) + "\n")
            self.process.stdin.flush()
        except BrokenPipeError:
            pass  # the server has exited: said below
        line = self.process.stdout.readline()
        if not line:
            status = self.process.wait()
            if status < 0:  # killed by a signal: named, since -8 (SIGFPE) or -9 (the OOM killer) say why
                status = f"{status}, {signal.Signals(-status).name}"
            raise RuntimeError(
                f"the OpenVINO process exited ({status}) on {request['op']} (its stderr above)"
            )
        reply = json.loads(line)
        if "error" in reply:
            raise RuntimeError(f"OpenVINO {request['op']}: {reply['error']}")
        return reply

    def _compile(self, implementation: str) -> None:
        import torch

        asked = (torch.get_num_threads(), IMPLEMENTATIONS[implementation])
        if asked != self.compiled:
            self.precisions = self._ask(op="compile", threads=asked[0], kv=asked[1], precision=self.precision)
            self.compiled = asked

    def _path(self, name: str) -> str:
        return f"{self.folder.name}/{name}.npy"

    def _run(self, implementation: str, ids: Any, steps: int, **request: Any) -> dict:
        import numpy as np

        self._compile(implementation)
        np.save(self._path("ids"), ids.numpy())
        return self._ask(op="run", ids=self._path("ids"), steps=steps, **request)

    def prefill_logits(self, implementation: str, ids: Any) -> Any:
        """The logits of every position of a prefill of the token ids (batch, tokens, vocab)."""
        import numpy as np
        import torch

        self._run(implementation, ids, 0, prefill_logits=self._path("logits"))
        return torch.from_numpy(np.load(self._path("logits")))

    def measure(self, implementation: str, ids: Any, steps: int) -> dict:
        """A prefill of the token ids and `steps` greedy decode steps, timed (Server.run)."""
        return self._run(implementation, ids, steps)

    def busy(self, implementation: str, ids: Any, steps: int) -> dict:
        """The threads busy during `steps` decode steps after a prefill of the token ids."""
        return self._run(implementation, ids, steps, busy=True)

    def decode_logits(self, implementation: str, ids: Any, feed: Any) -> Any:
        """The logits predicting each decode token after a prefill of the token ids, the steps
        fed the tokens of `feed` (batch, steps): (batch, steps + 1, vocab)."""
        import numpy as np
        import torch

        np.save(self._path("feed"), feed.numpy())
        self._run(implementation, ids, feed.shape[1], feed=self._path("feed"), logits=self._path("logits"))
        return torch.from_numpy(np.load(self._path("logits")))

    def reported(self, implementation: str) -> dict:
        """What OpenVINO reports of the implementation's compiled model: its KV cache's
        precision (and group size), its inference precision and threads."""
        self._compile(implementation)
        return {f"openvino_{k}": v for k, v in self.precisions.items()}

    def close(self) -> None:
        if self.process.stdin:
            with contextlib.suppress(BrokenPipeError):  # a server that has exited
                self.process.stdin.close()
        self.process.wait()
        self.folder.cleanup()


def main() -> int:
    # Replies go to the stdout this process started with; whatever the libraries print goes to
    # stderr, so that it cannot break a reply line.
    replies = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    serve(sys.stdin, replies)
    return 0


if __name__ == "__main__":
    sys.exit(main())
