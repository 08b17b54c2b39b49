"""Whole models on each attention implementation: what choosing mha's attention does to a
Hugging Face model's prefill and decode on this machine (scripts/sweep.sh --with-models).

    PYTHONPATH=tools:<build>/python <peers' python> -m mhapy.models.bench --out results/x-models.json

For each model (random weights from a fixed seed: the same weights in every run and for every
implementation; --layers N keeps its first N layers), precision, batch and thread count, and for
attn_implementation "eager", "sdpa", "mha" and "mha_tbb": the time to the first token (a prefill
of --prefill tokens, as generate() runs it; --fill synthetic instead fills every cache with the
same random keys and values, a long context without a prefill's cost, and times no first token)
and the decode rate (--decode tokens greedily after it, step by step through
transformers' own cache, the steps timed together), the share of each in
the attention function (timed around it) and a decode step's attention call in ms, the medians
of --repetitions rounds that take every implementation in turn (and each round's decode rate);
and the threads busy during decode (sampled from /proc/self/task in a decode of its own).
"mha" runs on the executor mha picks (inside PyTorch: PyTorch's own OpenMP workers), "mha_tbb"
on mha's own oneTBB workers, as "mha" did before. Each implementation's logits on a short
prompt are first checked against "sdpa"'s (fp32: 1e-4 of the largest; bf16: 2^-5) and a failing
one is recorded as such, not timed. Writes JSON (one record per case), which
`python3 -m mhapy.report ... --models FILE` turns into the report's "Whole models" section.
"mha_fp32", "mha_int8" and "mha_bf16" decode through mha's own KV cache (mha.transformers.MhaCache,
appended in place) in fp32 / int8 / bf16, "sdpa_static" is sdpa through transformers' StaticCache (preallocated, no concatenation);
each case records the bytes its cache holds, and for mha's implementations the decode steps'
logits against sdpa's over --logits-steps steps (the error and the top-1 agreement).
"openvino" and "openvino_u8" are OpenVINO through optimum-intel, the path CPU users of Hugging
Face models take: the same weights exported (from a folder the bench saves) to a stateful model
whose KV cache lives inside it, in the precision OpenVINO picks on this CPU / in u8; it runs in
its own environment (scripts/peers-env.sh optimum; --openvino-python) as a subprocess
(mhapy.models.openvino), needs --fill prefill (its cache cannot be filled from outside) and
records the precisions it reports. Every case records the process's peak RSS over its round
(the model's weights included; OpenVINO's in its own process). --profile-steps N runs N decode
steps of each in-process implementation under torch.profiler after its rounds: the ms a step
spends in the attention function, in each other PyTorch op and outside every op
(mhapy.models.step_profile), for a step that is slower while its attention call is not.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import platform
import sys
import time
from collections.abc import Iterator
from typing import Any

from .arguments import counts, listed
from .busy_threads import BusyThreads
from .between_ops import between_ops
from .hf import (
    IMPLEMENTATIONS,
    MODELS,
    attention_of,
    build,
    cache_bytes,
    cache_for,
    filled_synthetically,
)
from .openvino import DEFAULT_PYTHON, OpenVinoRuns
from .openvino import IMPLEMENTATIONS as OPENVINO
from ..peak_rss import peak_rss_bytes, reset_peak_rss
from .step_profile import per_step
from .timed_attention import labelled_attention, timed_attention


def check(model: Any, implementation: str, dtype: Any, openvino: OpenVinoRuns | None = None) -> str | None:
    """None when the implementation's logits on a short prompt agree with sdpa's (fp32: within
    1e-4 of the largest, mha_fp32 through its own cache too; mha_int8 / mha_bf16 within 5e-2 / 2e-2, OpenVINO
    within 2e-2, 5e-2 for its u8 cache; a bf16 model within 2^-5, plus 5e-2 for an 8-bit cache),
    else why not. The quantised caches' gate catches a broken cache (an error the size of the logits),
    not their rounding, which grows with the layers it passes (random weights, 48 tokens: 2.3e-2
    of the largest logit for int8 through Llama-1B's 16 layers) and which --logits-steps
    measures."""
    import torch

    ids = torch.randint(0, model.config.vocab_size, (2, 48), generator=torch.Generator().manual_seed(1))
    keep = torch.ones_like(ids)
    with torch.no_grad():
        model.set_attn_implementation("sdpa")
        want = model(ids, attention_mask=keep).logits.double()
        if implementation in OPENVINO:
            assert openvino is not None
            got = openvino.prefill_logits(implementation, ids).double()
        else:
            model.set_attn_implementation(attention_of(implementation))
            cache = cache_for(model, implementation, ids.shape[1])
            got = model(
                ids, attention_mask=keep, past_key_values=cache, use_cache=cache is not None
            ).logits.double()
    err, scale = (got - want).abs().max().item(), want.abs().max().item()
    # The model's own precision's share (fp32 1e-4, bf16 2^-5), plus what the cache rounds beyond
    # it: an 8-bit cache always, a 16-bit one only in an fp32 model.
    own = 1e-4 if dtype == torch.float32 else 2.0**-5
    beyond = {"mha_int8": 5e-2, "openvino_u8": 5e-2}
    if dtype == torch.float32:
        beyond |= {"mha_bf16": 2e-2, "openvino": 2e-2}
    bound = (own + beyond.get(implementation, 0.0)) * scale
    return None if err <= bound else f"logits differ from sdpa's by {err:.3g} (bound {bound:.3g})"


def start(model: Any, implementation: str, batch: int, prefill: int, capacity: int, fill: str) -> tuple:
    """The cache after `prefill` tokens, the logits predicting the next token (batch, 1, vocab),
    the tokens per sequence the cache then holds, and the time to the first token in s. fill
    "prefill": the model's prefill of a random prompt, as generate() runs it (the logits of the
    last position only); "synthetic": the cache filled_synthetically, then one decode step on a
    random token (prefill + 1 tokens held; no time to first token: None)."""
    import torch

    model.set_attn_implementation(attention_of(implementation))
    if fill == "synthetic":
        past = filled_synthetically(model, implementation, batch, prefill, capacity)
        out = model(
            prompt(model, batch, 1),
            attention_mask=torch.ones(batch, prefill + 1, dtype=torch.long),
            past_key_values=past,
            use_cache=True,
        )
        return out.past_key_values, out.logits[:, -1:], prefill + 1, None
    ids = prompt(model, batch, prefill)
    begin = time.perf_counter()
    # Random tokens, none of them padding: a mask of ones.
    out = model(
        ids,
        attention_mask=torch.ones_like(ids),
        past_key_values=cache_for(model, implementation, capacity),
        use_cache=True,
        logits_to_keep=1,
    )
    return out.past_key_values, out.logits[:, -1:], prefill, time.perf_counter() - begin


def steps(model: Any, past: Any, logits: Any, seen: int, count: int, feed: Any = None) -> Any:
    """`count` decode steps through `past`, which holds `seen` tokens per sequence; each step's
    token the argmax of the logits before it, or feed[:, i] (teacher forcing). The logits of
    every step (batch, count, vocab)."""
    import torch

    batch, got = logits.shape[0], []
    for i in range(count):
        token = logits.argmax(-1) if feed is None else feed[:, i : i + 1]
        seen += 1
        out = model(
            token,
            attention_mask=torch.ones(batch, seen, dtype=torch.long),
            past_key_values=past,
            use_cache=True,
        )
        logits, past = out.logits[:, -1:], out.past_key_values
        got.append(logits)
    return torch.cat(got, dim=1) if got else logits[:, :0]


def measure(
    model: Any,
    implementation: str,
    batch: int,
    prefill: int,
    decode: int,
    fill: str,
    openvino: OpenVinoRuns | None = None,
) -> dict:
    """One round: start() (the time to the first token where fill is "prefill"), then `decode` -
    1 greedy steps through that cache, timed together (generate()'s steps without its
    bookkeeping, and no subtraction of a separately timed prefill, which a long prompt's noise
    would swamp); the attention's share of each and a decode step's attention call in ms; the
    cache's bytes; the process's peak RSS over the round. OpenVINO's: the same steps in its
    process, without the attention's share (its attention is inside the compiled model)."""
    import torch

    if implementation in OPENVINO:
        assert openvino is not None and fill == "prefill"
        return openvino.measure(implementation, prompt(model, batch, prefill), decode - 1)
    reset_peak_rss()
    clock = {"attention": 0.0, "calls": 0}
    with timed_attention(model, attention_of(implementation), clock), torch.no_grad():
        past, logits, seen, ttft = start(model, implementation, batch, prefill, prefill + decode, fill)
        prefill_attention, prefill_calls = clock["attention"], clock["calls"]
        begin = time.perf_counter()
        steps(model, past, logits, seen, decode - 1)
        decode_s = max(time.perf_counter() - begin, 1e-9)
    decode_attention = clock["attention"] - prefill_attention
    decode_calls = max(clock["calls"] - prefill_calls, 1)
    timed = dict(
        decode_tokens_per_s=batch * (decode - 1) / decode_s,
        decode_attention_share=min(decode_attention / decode_s, 1.0),
        decode_attention_ms=1e3 * decode_attention / decode_calls,
        cache_bytes=cache_bytes(past),
        peak_rss_bytes=peak_rss_bytes(),
    )
    if ttft is not None:
        timed.update(ttft_s=ttft, prefill_attention_share=prefill_attention / ttft)
    return timed


def prompt(model: Any, batch: int, prefill: int) -> Any:
    import torch

    return torch.randint(
        0, model.config.vocab_size, (batch, prefill), generator=torch.Generator().manual_seed(2)
    )


def busy_threads(
    model: Any,
    implementation: str,
    batch: int,
    prefill: int,
    decode: int,
    fill: str,
    openvino: OpenVinoRuns | None = None,
) -> dict:
    """The threads busy during a decode of its own (`decode` - 1 steps after start()), untimed
    (the sampler takes the GIL and a core): their mean and most at once."""
    import torch

    if implementation in OPENVINO:
        assert openvino is not None
        return openvino.busy(implementation, prompt(model, batch, prefill), decode - 1)
    with torch.no_grad():
        past, logits, seen, _ = start(model, implementation, batch, prefill, prefill + decode, fill)
        with BusyThreads() as busy:
            steps(model, past, logits, seen, decode - 1)
    return dict(decode_busy_threads=busy.mean, decode_busy_threads_most=busy.most)


def profile(model: Any, implementation: str, batch: int, prefill: int, count: int, fill: str) -> dict:
    """`count` decode steps after start() under torch.profiler, untimed otherwise: a step's
    milliseconds in the attention function, in each other PyTorch op and outside every op
    (step_profile.per_step), where the rounds' tokens/s and attention calls leave a gap
    unexplained."""
    import torch

    with torch.no_grad():
        past, logits, seen, _ = start(model, implementation, batch, prefill, prefill + count, fill)
        with (
            labelled_attention(model, attention_of(implementation)),
            torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profiler,
        ):
            begin = time.perf_counter()
            steps(model, past, logits, seen, count)
            wall = time.perf_counter() - begin
    return dict(decode_profile=per_step(profiler.events(), count, wall))


def sdpa_reference(model: Any, batch: int, prefill: int, count: int, fill: str) -> tuple[Any, Any]:
    """sdpa's greedy tokens for `count` steps after start(), and its logits predicting each of
    them (batch, count, vocab): what logits_error compares with, once per case."""
    import torch

    with torch.no_grad():
        past, first, seen, _ = start(model, "sdpa", batch, prefill, prefill + count, fill)
        later = steps(model, past, first, seen, count - 1)
    want = torch.cat([first, later], dim=1)
    return want.argmax(-1), want


def logits_error(
    model: Any,
    implementation: str,
    reference: tuple[Any, Any],
    prefill: int,
    fill: str,
    openvino: OpenVinoRuns | None = None,
) -> dict:
    """The decode steps' logits against sdpa's (sdpa_reference's tokens and logits), sdpa's greedy
    tokens fed to both (teacher forcing): each step's largest logit error over its largest logit
    (the worst and the median step), and the share of steps and sequences whose top-1 token is
    sdpa's: what a KV cache's precision does to a model."""
    import statistics

    import torch

    tokens, want = reference
    count = want.shape[1]
    if implementation in OPENVINO:
        assert openvino is not None
        got = openvino.decode_logits(
            implementation, prompt(model, tokens.shape[0], prefill), tokens[:, : count - 1]
        )
    else:
        with torch.no_grad():
            past, first, seen, _ = start(
                model, implementation, tokens.shape[0], prefill, prefill + count, fill
            )
            later = steps(model, past, first, seen, count - 1, feed=tokens)
        got = torch.cat([first, later], dim=1)
    errors = ((got - want).abs().amax(dim=(0, 2)) / want.abs().amax(dim=(0, 2))).double().tolist()
    return dict(
        decode_logits_error=max(errors),
        decode_logits_error_median=statistics.median(errors),
        top1_agreement=(got.argmax(-1) == want.argmax(-1)).double().mean().item(),
        logits_steps=count,
    )


def medians(rounds: list[dict]) -> dict:
    """Each measure's median over the rounds, and every round's decode rate (the spread a
    median hides: this kind of machine moves 10-20% between rounds)."""
    import statistics

    got = {key: statistics.median(r[key] for r in rounds) for key in rounds[0]}
    got["decode_tokens_per_s_rounds"] = [r["decode_tokens_per_s"] for r in rounds]
    return got


@contextlib.contextmanager
def openvino_failure(implementation: str, failed: dict[str, str]) -> Iterator[None]:
    """OpenVINO's process failing (a RuntimeError from its client) while `implementation` is
    timed or sampled: recorded in `failed` (its rows say so, the rest of the bench goes on)."""
    try:
        yield
    except RuntimeError as e:
        if implementation not in OPENVINO:
            raise
        failed[implementation] = f"not run: OpenVINO failed while timed: {e}"


DTYPES = ("float32", "bfloat16")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m mhapy.models.bench", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "--models", type=listed(tuple(MODELS)), default="gpt2,llama1b", help=f"of {', '.join(MODELS)}"
    )
    parser.add_argument(
        "--dtypes", type=listed(DTYPES), default="float32,bfloat16", help=f"of {', '.join(DTYPES)}"
    )
    parser.add_argument("--batches", type=counts(1), default="1,8")
    parser.add_argument("--threads", type=counts(0), default="1,0", help="0: all cores")
    parser.add_argument(
        "--attention",
        type=listed(tuple(IMPLEMENTATIONS)),
        default=",".join(IMPLEMENTATIONS),
        help=f"of {', '.join(IMPLEMENTATIONS)}",
    )
    parser.add_argument("--prefill", type=int, default=1024)
    parser.add_argument("--decode", type=int, default=128)
    parser.add_argument(
        "--repetitions", type=int, default=3, help="rounds of every implementation in turn; medians are kept"
    )
    parser.add_argument(
        "--between-ops",
        type=int,
        default=200,
        metavar="N",
        help="steps of the decode attention call between two torch ops per implementation and thread "
        "count, in --repetitions slices taken in turn (0: none)",
    )
    parser.add_argument(
        "--logits-steps",
        type=int,
        default=64,
        metavar="N",
        help="decode steps whose logits mha's implementations are compared with sdpa's on, per case (0: none)",
    )
    parser.add_argument(
        "--profile-steps",
        type=int,
        default=0,
        metavar="N",
        help="decode steps run under torch.profiler per case and implementation (not OpenVINO's), after its rounds: "
        "the ms a step spends in the attention function, in each other op and outside every op (0: none)",
    )
    parser.add_argument(
        "--fill",
        choices=("prefill", "synthetic"),
        default="prefill",
        help="how the cache gets its --prefill tokens: the model's prefill of a random prompt (timed: the time "
        "to first token), or random keys and values, the same for every implementation (filled_synthetically: a "
        "long context without a prefill's cost; no time to first token)",
    )
    parser.add_argument(
        "--layers", type=int, default=0, metavar="N", help="the models' first N layers only (0: all)"
    )
    parser.add_argument(
        "--openvino-python",
        default=DEFAULT_PYTHON,
        metavar="PYTHON",
        help="the Python of the optimum-intel environment that runs openvino and openvino_u8 (scripts/peers-env.sh "
        "optimum makes it; default: $MHA_OPTIMUM_PYTHON or its place in build/)",
    )
    parser.add_argument("--out", required=True, help="the JSON file to write")
    args = parser.parse_args(argv)
    if args.layers < 0:
        parser.error(f"--layers {args.layers}: expected 0 (all) or a positive number of layers")
    if args.profile_steps < 0:
        parser.error(f"--profile-steps {args.profile_steps}: expected 0 (none) or a positive number of steps")

    import os

    import torch

    import mha.transformers  # registers "mha"

    mha.transformers.register("mha_tbb", executor="tbb")

    cpu = next(
        (line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")),
        platform.processor(),
    )
    records = []
    for name in args.models:
        for dtype_name in args.dtypes:
            dtype = getattr(torch, dtype_name)
            model = build(name, dtype, args.layers)
            openvino, declined = None, ""
            if any(impl in OPENVINO for impl in args.attention):
                if args.fill != "prefill":
                    declined = (
                        "not run: OpenVINO's cache lives inside its compiled model, filled only by a prefill"
                    )
                else:
                    try:
                        openvino = OpenVinoRuns(model, args.openvino_python)
                    except RuntimeError as e:
                        declined = f"not run: {e}"

            def verdict(impl: str) -> str | None:
                if impl not in OPENVINO:
                    return check(model, impl, dtype)
                try:  # OpenVINO's compile or run failing in its process: its rows say so
                    return declined or check(model, impl, dtype, openvino)
                except RuntimeError as e:
                    return f"not run: {e}"

            verdicts = {impl: verdict(impl) for impl in args.attention}
            # OpenVINO's implementations whose process failed after their check, and how.
            failed: dict[str, str] = {}
            for threads in args.threads:
                torch.set_num_threads(threads or os.cpu_count() or 1)
                for batch in args.batches:
                    timed = [impl for impl in args.attention if not verdicts[impl]]
                    # Rounds of every implementation in turn: a drift of the machine's speed
                    # meets them all alike.
                    rounds: dict[str, list[dict]] = {impl: [] for impl in timed}
                    for _ in range(args.repetitions):
                        for impl in [impl for impl in timed if not failed.get(impl)]:
                            with openvino_failure(impl, failed):
                                rounds[impl].append(
                                    measure(
                                        model, impl, batch, args.prefill, args.decode, args.fill, openvino
                                    )
                                )
                    reference = None
                    for impl in args.attention:
                        case = dict(
                            model=name,
                            dtype=dtype_name,
                            batch=batch,
                            threads=torch.get_num_threads(),
                            attention=impl,
                            prefill=args.prefill,
                            decode=args.decode,
                            fill=args.fill,
                            layers=model.config.num_hidden_layers,
                            cpu=cpu,
                        )
                        record = dict(case)
                        if verdicts[impl] or failed.get(impl):
                            record["error"] = verdicts[impl] or failed[impl]
                        else:
                            record.update(medians(rounds[impl]), rounds=args.repetitions)
                            with openvino_failure(impl, failed):
                                record.update(
                                    busy_threads(
                                        model, impl, batch, args.prefill, args.decode, args.fill, openvino
                                    )
                                )
                                if openvino is not None and impl in OPENVINO:
                                    record.update(openvino.reported(impl))
                                elif args.profile_steps:
                                    record.update(
                                        profile(
                                            model, impl, batch, args.prefill, args.profile_steps, args.fill
                                        )
                                    )
                                if args.logits_steps and (impl.startswith("mha") or impl in OPENVINO):
                                    if reference is None:  # one sdpa reference for the case's implementations
                                        reference = sdpa_reference(
                                            model, batch, args.prefill, args.logits_steps, args.fill
                                        )
                                    record.update(
                                        logits_error(
                                            model, impl, reference, args.prefill, args.fill, openvino
                                        )
                                    )
                            if failed.get(impl):  # its rounds are not kept: it did not finish
                                record = dict(case, error=failed[impl])
                        records.append(record)
                        print(json.dumps(record), flush=True)
            if openvino is not None:
                openvino.close()
    calls = []
    if args.between_ops:
        for threads in args.threads:
            torch.set_num_threads(threads or os.cpu_count() or 1)
            for result in between_ops(
                ["sdpa", "mha", "mha_tbb"], args.prefill, args.between_ops, args.repetitions
            ):
                record = dict(result, cpu=cpu)
                calls.append(record)
                print(json.dumps(record), flush=True)
    with open(args.out, "w") as f:
        json.dump(
            {
                "context": {"cpu": cpu, "torch": torch.__version__, "executor": mha.default_executor()},
                "models": records,
                "between_ops": calls,
            },
            f,
            indent=1,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
