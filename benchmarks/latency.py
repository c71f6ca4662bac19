"""Prefill and per-token decode latency of every position-bias method, as ratios to ``none``.

    .venv/bin/python benchmarks/latency.py --model smollm2-135m --lengths 1024,4096 --reps 3 --decode 16

All methods run on the same model and the same prompt (filler text cut to each length),
interleaved: for every repetition and length the methods run round-robin, so machine load affects
all alike, and the order rotates by one place per repetition (``--order rotate``, the default; ``fixed``
runs them as listed every time, as the 4K study of 2026-12-05 did), so no method always runs first.
Reported per method and length: median prefill seconds, median seconds per decoded token
(manual greedy loop with past_key_values, batch 1), and both as ratios to ``none``. The JSON file
holds the raw timings too, and each repetition's ratios to ``none`` (``prefill_ratios``,
``decode_ratios``: the spread between repetitions). It is rewritten after every repetition, so a run
stopped early keeps its finished repetitions (``reps_done``) and their medians, and the same command
run again resumes at the next repetition (a 4K run of every method takes minutes per repetition on a
CPU; other settings on the same ``--out`` stop with one line). Seconds from different days on a
shared machine are not comparable, the ratios inside one repetition are: methods run round-robin.

Methods and options: ``--methods none,pi,ms-poe,attention-buckets,moice`` (``lpes`` needs a factors
file: ``--lpes-factors PATH``). MoICE uses untrained routers (same cost as trained ones); PI uses
factor 1.5, temperature t = 1.2, positional-hidden factor 0 on dims 0 and 1 in the reference band. A
variant with other options is ``name@key=value@key=value`` (e.g.
``ms-poe@rotated_cache=false``, the decoding path that re-rotates the whole key cache each step).

On a GPU, the paper's comparison on the hardware it was made for, with nothing large to move:
``--random-config qwen2.5-7b`` (or ``vicuna-7b``) builds a randomly initialised model of that shape
from its config on ``--device cuda`` in ``--dtype bfloat16`` (latency does not depend on the weights;
prompts are random token ids; LPES gets a factors file of the model's layer count written into the
output folder)::

    python benchmarks/latency.py --random-config qwen2.5-7b --device cuda --dtype bfloat16 \
        --lengths 4096,16384 --methods none,pi,lpes,ms-poe,attention-buckets,moice --reps 5 --decode 32 \
        --out runs/latency-gpu/qwen7b.json
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM

from posbias.architecture.layers import cache_of
from posbias.methods import apply_method
from posbias.methods.registry import split_variant
from posbias.models import load_model
from posbias.patching.rope_scaling import save_factors_file
from posbias.utils.io import atomic_write_text

FILLER = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. "
DEFAULT_OPTIONS = {"pi": {"factor": 1.5}, "ms-poe": {}, "attention-buckets": {}, "moice": {}, "none": {},
                   "temperature": {"t": 1.2}, "positional-hidden": {"dims": [0, 1], "factor": 0.0}}


def prompt_ids(tok, length: int) -> torch.Tensor:
    ids = tok(FILLER * (length // 10 + 10), add_special_tokens=False, return_tensors="pt")["input_ids"][:, :length]
    if ids.shape[1] < length:
        raise ValueError(f"could not build a {length}-token prompt")
    return ids


@torch.no_grad()
def time_method(callable_model, ids: torch.Tensor, decode_steps: int) -> tuple[float, float]:
    """(prefill seconds, seconds per decoded token) for one prompt, greedy, batch 1."""
    sync = torch.cuda.synchronize if ids.is_cuda else (lambda: None)
    mask = torch.ones_like(ids)
    pos = torch.arange(ids.shape[1], device=ids.device)[None]
    sync()
    t0 = time.perf_counter()
    out = callable_model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True, logits_to_keep=1)
    sync()
    t1 = time.perf_counter()
    cache = cache_of(out)
    nxt = out.logits[:, -1].argmax(-1, keepdim=True)
    t2 = time.perf_counter()
    for _ in range(decode_steps):
        mask = torch.cat([mask, torch.ones_like(nxt)], 1)
        pos = pos[:, -1:] + 1
        out = callable_model(input_ids=nxt, attention_mask=mask, position_ids=pos, cache=cache,
                             use_cache=True, logits_to_keep=1)
        cache = cache_of(out)
        nxt = out.logits[:, -1].argmax(-1, keepdim=True)
    sync()
    t3 = time.perf_counter()
    return t1 - t0, (t3 - t2) / max(decode_steps, 1)


# Shapes of the paper's models (Hugging Face configs; weights are not needed for latency).
RANDOM_CONFIGS = {
    "qwen2.5-7b": dict(model_type="qwen2", hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
                       num_attention_heads=28, num_key_value_heads=4, vocab_size=152064, rope_theta=1e6,
                       max_position_embeddings=131072),
    "vicuna-7b": dict(model_type="llama", hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
                      num_attention_heads=32, num_key_value_heads=32, vocab_size=32000, rope_theta=1e4,
                      max_position_embeddings=131072),
    "tiny": dict(model_type="llama", hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, vocab_size=500, rope_theta=1e4,
                 max_position_embeddings=131072),
}


def random_model(name: str, device: str, dtype: torch.dtype):
    """A randomly initialised causal LM of ``RANDOM_CONFIGS[name]``'s shape on ``device``."""

    spec = dict(RANDOM_CONFIGS[name])
    cfg = AutoConfig.for_model(spec.pop("model_type"), **spec)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(cfg, dtype=dtype)
    return model.eval()


def random_prompt(vocab: int, length: int, device) -> torch.Tensor:
    return torch.randint(3, vocab, (1, length), generator=torch.Generator().manual_seed(length)).to(device)


def method_spec(spec: str) -> tuple[str, dict]:
    """``"ms-poe@rotated_cache=false"`` -> ``("ms-poe", {**defaults, "rotated_cache": False})``."""

    name, options = split_variant(spec)
    return name, {**DEFAULT_OPTIONS.get(name, {}), **options}


def summarise(raw: dict) -> dict:
    """``{method: {length: {prefill_s, decode_s_per_token, prefill_ratio, decode_ratio, prefill_ratios,
    decode_ratios, prefill_ratio_rep_median, decode_ratio_rep_median}}}``: medians over the repetitions
    in ``raw`` (``{method: {length: {"prefill": [s], "decode": [s/token]}}}``), ratios to ``none``'s
    medians, each repetition's own ratios and their median (the paired figure: a ratio of medians can
    divide timings from different repetitions)."""
    summary = {}
    for m, by_length in raw.items():
        summary[m] = {}
        for n, runs in by_length.items():
            pre, dec = statistics.median(runs["prefill"]), statistics.median(runs["decode"])
            base = raw["none"][n]
            per_rep = {k: [a / b for a, b in zip(runs[k], base[k])] for k in ("prefill", "decode")}
            summary[m][n] = {"prefill_s": pre, "decode_s_per_token": dec,
                             "prefill_ratio": pre / statistics.median(base["prefill"]),
                             "decode_ratio": dec / statistics.median(base["decode"]),
                             "prefill_ratios": per_rep["prefill"], "decode_ratios": per_rep["decode"],
                             "prefill_ratio_rep_median": statistics.median(per_rep["prefill"]),
                             "decode_ratio_rep_median": statistics.median(per_rep["decode"])}
    return summary


# Settings a resumed run must share with the file it continues (``reps`` may grow).
RESUME_KEYS = ("model", "random_weights", "device", "dtype", "lengths", "methods", "options", "decode_steps", "threads",
               "order")


def method_order(methods: list[str], rep: int, order: str) -> list[str]:
    """The methods in the order repetition ``rep`` (0-based) runs them: ``fixed`` always as given,
    ``rotate`` shifted by one place per repetition, so over ``len(methods)`` repetitions each method runs
    once in every slot and a drift in machine speed inside a repetition is not always charged to the
    same method."""
    if order == "fixed":
        return list(methods)
    shift = rep % len(methods)
    return methods[shift:] + methods[:shift]


def resume_raw(out: str, info: dict, lengths: list[int]) -> tuple[dict | None, int]:
    """The raw timings and ``reps_done`` of an earlier run written to ``out`` with the same settings
    (``(None, 0)`` when there is none); other settings stop with one line naming the first difference."""
    path = Path(out)
    if not path.exists():
        return None, 0
    try:
        doc = json.loads(path.read_text())
        doc.setdefault("order", "fixed")  # files written before --order existed ran in a fixed order
        old = {k: doc[k] for k in RESUME_KEYS}
    except (ValueError, KeyError, TypeError):
        raise SystemExit(f"{out} exists and is not a latency result; use another --out") from None
    for key in RESUME_KEYS:
        if json.loads(json.dumps(info[key])) != old[key]:
            raise SystemExit(f"{out} holds a run with other settings ({key}: {old[key]} there, {info[key]} now); "
                             "use another --out to start a new one")
    raw = {m: {n: doc["raw"][m][str(n)] for n in lengths} for m in info["methods"]}
    return raw, int(doc["reps_done"])


def write_result(out: str, info: dict, raw: dict, reps_done: int) -> dict:
    """Write (atomically) the settings, the medians of the ``reps_done`` finished repetitions and every
    measurement to ``out``; return what was written."""

    summary = summarise(raw)
    result = {**info, "reps_done": reps_done,
              "summary": {m: {str(n): v for n, v in s.items()} for m, s in summary.items()},
              "raw": {m: {str(n): v for n, v in s.items()} for m, s in raw.items()}}
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(Path(out), json.dumps(result, indent=2))
    return result


def print_table(summary: dict, methods: list[str], lengths: list[int]) -> None:
    """The medians and ratios of :func:`write_result`'s summary, one row per method: ``x`` the ratio of
    the medians to ``none``'s, in brackets the median of the per-repetition ratios."""
    header = f"{'method':26s}" + "".join(f" | {f'{n} tok prefill':>22s} {'decode/token':>24s}" for n in lengths)
    print("\n" + header)
    print("-" * len(header))
    for m in methods:
        row = f"{m:26s}"
        for n in lengths:
            s = summary[m][str(n)]
            pre = f"{s['prefill_s']:.2f}s x{s['prefill_ratio']:.2f} [{s['prefill_ratio_rep_median']:.2f}]"
            dec = (f"{s['decode_s_per_token'] * 1000:.1f}ms x{s['decode_ratio']:.2f} "
                   f"[{s['decode_ratio_rep_median']:.2f}]")
            row += f" | {pre:>22s} {dec:>24s}"
        print(row)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--lengths", default="1024,4096", help="prompt lengths in tokens, comma-separated")
    ap.add_argument("--methods", default="none,pi,ms-poe,attention-buckets,moice")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--decode", type=int, default=16, help="decoded tokens per run")
    ap.add_argument("--warmup", type=int, default=1, help="untimed runs per method at the shortest length")
    ap.add_argument("--lpes-factors", default=None, help="factors file for --methods lpes")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: leave the default)")
    ap.add_argument("--random-config", choices=sorted(RANDOM_CONFIGS), default=None,
                    help="a randomly initialised model of this shape instead of --model")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"))
    ap.add_argument("--order", default="rotate", choices=("rotate", "fixed"),
                    help="method order inside each repetition: rotated by one place per repetition, or fixed")
    ap.add_argument("--out", default="latency.json")
    args = ap.parse_args(argv)
    if args.reps < 1:
        raise SystemExit(f"--reps must be >= 1, got {args.reps}")


    if args.threads:
        torch.set_num_threads(args.threads)
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    if "none" not in methods:
        methods.insert(0, "none")
    lengths = [int(x) for x in args.lengths.split(",") if x.strip()]
    specs = {m: method_spec(m) for m in methods}
    options = {m: opts for m, (_, opts) in specs.items()}
    dtype = getattr(torch, args.dtype)
    if args.random_config:
        model = random_model(args.random_config, args.device, dtype)
        prompts = {n: random_prompt(model.config.vocab_size, n, args.device) for n in lengths}
        if any(name == "lpes" for name, _ in specs.values()) and not args.lpes_factors:

            args.lpes_factors = str(Path(args.out).with_suffix(".factors.json"))
            layers = model.config.num_hidden_layers
            Path(args.out).parent.mkdir(parents=True, exist_ok=True)
            save_factors_file(args.lpes_factors, factors=[1.0 + 0.5 * i / max(layers - 1, 1) for i in range(layers)])
    else:
        model, tok = load_model(args.model, dtype=dtype, device=args.device)
        prompts = {n: prompt_ids(tok, n).to(args.device) for n in lengths}
    for name, opts in specs.values():
        if name == "lpes":
            if not args.lpes_factors:
                raise SystemExit("--methods lpes needs --lpes-factors PATH")
            opts.setdefault("factors", args.lpes_factors)
    raw = {m: {n: {"prefill": [], "decode": []} for n in lengths} for m in methods}

    def run(method: str, n: int, record: bool) -> None:
        handle = apply_method(model, specs[method][0], **options[method])
        try:
            pre, dec = time_method(handle.model, prompts[n], args.decode)
        finally:
            handle.remove()
        if record:
            raw[method][n]["prefill"].append(pre)
            raw[method][n]["decode"].append(dec)
            print(f"  {method:26s} {n:6d} tokens: prefill {pre:7.3f} s  decode {dec * 1000:8.1f} ms/token", flush=True)

    info = {"model": args.random_config or args.model, "random_weights": bool(args.random_config),
            "device": args.device, "dtype": args.dtype,
            "gpu": torch.cuda.get_device_name() if str(args.device).startswith("cuda") else None,
            "lengths": lengths, "methods": methods, "options": options, "reps": args.reps,
            "decode_steps": args.decode, "threads": torch.get_num_threads(), "order": args.order}
    earlier, done = resume_raw(args.out, info, lengths)
    raw = earlier or raw
    if done:
        print(f"resuming {args.out}: {done} of {args.reps} repetitions done", flush=True)
    result = write_result(args.out, info, raw, reps_done=done) if done else {}
    if done < args.reps:
        for _ in range(args.warmup):
            for m in methods:
                run(m, min(lengths), record=False)
    for rep in range(done, args.reps):
        print(f"rep {rep + 1}/{args.reps}", flush=True)
        for n in lengths:
            for m in method_order(methods, rep, args.order):  # round-robin over methods
                run(m, n, record=True)
        result = write_result(args.out, info, raw, reps_done=rep + 1)  # a stopped run keeps its finished repetitions
    print_table(result["summary"], methods, lengths)
    print(f"\nwrote {args.out}")
    return result


if __name__ == "__main__":
    main()
