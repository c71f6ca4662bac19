"""The GPU check of the training-free side, in one run of under 10 minutes on one H100 (estimated):

    python benchmarks/gpu_check.py --out $OUT/gpu_check          # on a CUDA machine
    python benchmarks/gpu_check.py --dry-run --out /tmp/gpu_check  # the same steps on CPU, tiny and short

On a model of a real 7B shape (``--config qwen2.5-7b``: random weights from Qwen2.5-7B's config, built
on the GPU in bfloat16 by ``benchmarks/latency.py``'s ``random_model``; nothing is downloaded):

1. identity: every method at its identity setting (pi factor 1, LPES factors all 1, Ms-PoE ratios 1,
   Attention Buckets one base, MoICE one expert at the model's base, temperature 1, positional-hidden
   factor 1) against the unpatched model on a left-padded batch, prefill and one cached decoding step:
   ``torch.equal`` and the largest |difference| of the logits;
2. search: one ``quick``-preset LPES search end to end (``posbias.search.runner.run_search``) on the
   kv task, with a byte-level BPE tokenizer trained here on the tasks' own text (the model's weights
   are random: the search checks the GPU path and its time, not an accuracy);
3. save: the model and that tokenizer written as a Hugging Face folder (15 GB of bfloat16 safetensors
   for the 7B shape, in a temporary folder);
4. latency: ``benchmarks/latency.py`` for none / pi / lpes / ms-poe / attention-buckets / moice /
   temperature / positional-hidden at 4K and 16K tokens, prefill and decode as ratios to ``none``,
   interleaved with the order rotating;
5. BAM: ``benchmarks/gpu_check_bam.py`` (FlexAttention against the exact chunked path, and training
   throughput per scheme);
6. load and eval: ``benchmarks/load_and_eval.py`` on the saved folder in a fresh process: the loader's
   time and GPU memory (the weights read straight into bfloat16 on the GPU) and one ``posbias eval``
   through the command line (kv, 256 keys: ~4K tokens, 30 instances), its time and peak GPU memory;
7. shard: a small random Llama (8 layers) saved and loaded twice, on one device and with
   ``--device shard`` (split over every visible GPU; one GPU holds it all, and the CPU of a dry run
   takes transformers' ``device_map="auto"`` path without GPUs): every method at a real setting,
   prefill and one cached step, logits of the two loads compared.

The wall time and peak GPU memory of each step are recorded. A step that fails (out of memory, say) is
recorded with its traceback and the next steps still run (exit status 1 at the end). ``--out`` receives
``gpu_check.json`` (everything) and ``gpu_check.md`` (the tables), both rewritten after every step, so a
run stopped by a time limit keeps what it measured, and ``latency.json``, ``gpu_check_bam.json`` and
``load_and_eval.json``.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
import tomllib
import traceback
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import torch
import transformers
from packaging.requirements import Requirement

from posbias.methods import apply_method
from posbias.models.loader import load_hf_folder, load_model
from posbias.models.options import LoadOptions
from posbias.patching.rope_scaling import save_factors_file
from posbias.search.config import SearchConfig
from posbias.search.runner import run_search
from posbias.training.tokenizer import synthetic_task_texts, train_bpe_tokenizer
from posbias.utils.devices import SHARD, Placement, ResolvedPlacement, dtype_name
from posbias.utils.io import atomic_write_text
from posbias.utils.memory import gpu_memory_gib, release_cached_memory, reset_gpu_peaks

sys.path.insert(0, str(Path(__file__).resolve().parent))  # latency.py, gpu_check_bam.py beside this file
PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"

IDENTITY = {
    "pi": {"factor": 1.0},
    "lpes": {"factors": None},  # a factors file of ones, written for the model's layer count
    "ms-poe": {"r_min": 1.0, "r_max": 1.0, "skip_layers": 0},
    "attention-buckets": {"multipliers": [1.0]},
    "moice": {"multipliers": [1.0], "top_k": 1},
    "temperature": {"t": 1.0},
    "positional-hidden": {"dims": [0, 1], "factor": 1.0},
}
FULL = {"config": "qwen2.5-7b", "device": "cuda", "identity_tokens": 1024, "lengths": "4096,16384", "reps": 2,
        "decode": 16, "search_keys": 30, "search_overrides": {},
        "eval_args": ["--task", "kv", "--num-keys", "256", "--n", "10", "--depths", "0,0.5,1", "--batch-size", "8"]}
DRY = {"config": "tiny", "device": "cpu", "identity_tokens": 24, "lengths": "32,64", "reps": 1, "decode": 2,
       "search_keys": 4, "search_overrides": {"population": 3, "generations": 1, "n_per_depth": 1, "batch_size": 3},
       "eval_args": ["--task", "kv", "--num-keys", "4", "--n", "1", "--depths", "0,1", "--batch-size", "2"]}
BENCHMARKS = Path(__file__).resolve().parent
# Real settings for the shard step (MoICE's fresh routers are seeded, so both loads get the same ones).
SHARD_SETTINGS = {
    "none": {},
    "pi": {"factor": 4.0},
    "lpes": {"factors": None},  # a factors file of 1 .. 4 over the layers, written for the model
    "ms-poe": {"r_min": 1.2, "r_max": 1.8},
    "attention-buckets": {"multipliers": [0.5, 1.0, 2.0]},
    "moice": {"multipliers": [0.5, 1.0, 2.0], "top_k": 3},
    "temperature": {"t": 1.2},
    "positional-hidden": {"dims": [0, 1], "factor": 0.5},
}
SHARD_CONFIG = dict(model_type="llama", hidden_size=64, intermediate_size=128, num_hidden_layers=8,
                    num_attention_heads=4, num_key_value_heads=2, vocab_size=500, rope_theta=1e4,
                    max_position_embeddings=4096)


def unmet_requirements(pyproject: Path = PYPROJECT, installed=None) -> list[str]:
    """``"transformers 5.17.0 (needs <6,>=5.24)"`` / ``"gguf: not installed"`` for each dependency of
    ``pyproject`` that this environment does not meet (``installed(name) -> version``; default: the
    installed distributions). The script runs from a checkout (``PYTHONPATH=src``), so nothing else
    checks them before a method fails mid-run."""
    installed = installed or version
    problems = []
    for line in tomllib.loads(pyproject.read_text())["project"]["dependencies"]:
        req = Requirement(line)
        try:
            found = installed(req.name)
        except PackageNotFoundError:
            problems.append(f"{req.name}: not installed")
            continue
        if not req.specifier.contains(found, prereleases=True):
            problems.append(f"{req.name} {found} (needs {req.specifier})")
    return problems


def shard_check(tok, device: torch.device, dtype: torch.dtype, folder: Path, tokens: int = 64) -> dict:
    """``{"devices": [...], "methods": {method: {"equal", "max_abs_diff"}}}``: :data:`SHARD_CONFIG` with
    random weights saved to ``folder`` and loaded on ``device`` and with ``--device shard`` (on the CPU:
    ``device_map="auto"`` without GPUs); each method's logits of the two loads compared."""
    from transformers import AutoConfig, AutoModelForCausalLM  # noqa: PLC0415

    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(AutoConfig.for_model(**SHARD_CONFIG), dtype=dtype).save_pretrained(folder)
    tok.save_pretrained(folder)
    one, _ = load_model(str(folder), LoadOptions(str(device), dtype_name(dtype)))
    if device.type == "cuda":
        sharded, _ = load_model(str(folder), LoadOptions(SHARD, dtype_name(dtype)))
    else:  # shard needs CUDA; the same device_map="auto" load, which places everything on the CPU
        sharded, _ = load_hf_folder(folder, ResolvedPlacement(Placement(SHARD, dtype_name(dtype)), device, dtype))
    ids, mask, pos = left_padded_ids(SHARD_CONFIG["vocab_size"], tokens, device, seed=1)
    results = {}
    for name, options in SHARD_SETTINGS.items():
        if name == "lpes":
            save_factors_file(folder / "factors.json", factors=[1.0 + 3.0 * i / 7 for i in range(8)])
            options = {"factors": str(folder / "factors.json")}
        logits = []
        for model in (one, sharded):
            with apply_method(model, name, **options) as h:
                logits.append(_prefill_and_step(h.model, ids, mask, pos, tokens))
        results[name] = compare_logits(*logits)
        print(f"shard {name:18s} equal={results[name]['equal']}  max|diff| {results[name]['max_abs_diff']:.3g}",
              flush=True)
    return {"devices": sorted({str(p.device) for p in sharded.parameters()}), "methods": results}


def ones_factors(model, folder: Path) -> str:
    """A factors file of 1.0 per decoder layer (LPES's identity setting)."""

    path = folder / "ones.factors.json"
    save_factors_file(path, factors=[1.0] * model.config.num_hidden_layers)
    return str(path)


@torch.no_grad()
def _prefill_and_step(model, ids, mask, pos, keep: int) -> list[torch.Tensor]:
    """Logits of the last ``keep`` prefill positions and of one cached decoding step."""
    out = model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True, logits_to_keep=keep)
    nxt = out.logits[:, -1:].argmax(-1)
    step = model(input_ids=nxt, attention_mask=torch.cat([mask, torch.ones_like(nxt)], 1),
                 position_ids=pos[:, -1:] + 1, cache=out.past_key_values, use_cache=True, logits_to_keep=1)
    return [out.logits, step.logits]


def identity_checks(model, tokens: int, folder: Path) -> dict:
    """``{method: {"equal": bool, "max_abs_diff": float}}`` of every method at its identity setting."""

    ids, mask, pos = left_padded_ids(model.config.vocab_size, tokens, next(model.parameters()).device, seed=0)
    keep = min(64, tokens - tokens // 4)
    ref = _prefill_and_step(model, ids, mask, pos, keep)
    results = {}
    for name, options in IDENTITY.items():
        options = {**options, "factors": ones_factors(model, folder)} if name == "lpes" else options
        with apply_method(model, name, **options) as h:
            results[name] = compare_logits(_prefill_and_step(h.model, ids, mask, pos, keep), ref)
        print(f"identity {name:18s} equal={results[name]['equal']}  max|diff| {results[name]['max_abs_diff']:.3g}",
              flush=True)
    return results


def left_padded_ids(vocab: int, tokens: int, device: torch.device, seed: int):
    """``(ids, mask, position_ids)``, each (2, tokens) on ``device``: random ids, the second row
    left-padded by a quarter of its length."""
    ids = torch.randint(3, vocab, (2, tokens), generator=torch.Generator().manual_seed(seed))
    mask = torch.ones_like(ids)
    mask[1, : tokens // 4] = 0
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    return ids.to(device), mask.to(device), pos.to(device)


def compare_logits(got: list[torch.Tensor], ref: list[torch.Tensor]) -> dict:
    """``{"equal", "max_abs_diff"}`` over pairs of logits (``got[i]`` against ``ref[i]``, on any devices)."""
    pairs = [(a.float(), b.float().to(a.device)) for a, b in zip(got, ref)]
    return {"equal": all(torch.equal(a, b) for a, b in pairs),
            "max_abs_diff": max(float((a - b).abs().max()) for a, b in pairs)}


def search_check(model, tok, config: str, folder: Path, keys: int, overrides: dict) -> dict:
    """One quick-preset LPES search on ``model`` with ``tok`` (kv task, ``keys`` word keys) into ``folder``."""

    start = time.perf_counter()
    search = SearchConfig(model=f"random {config}", task="kv", out=str(folder / "search"), preset="quick", seed=0,
                          task_options={"num_keys": keys}, overrides=overrides)
    res = run_search(search, resume=True, loaded=(model, tok))
    return {"seconds": round(time.perf_counter() - start, 1), "generations": res.generations,
            "factors": res.factors, "accuracy": res.accuracy, "num_keys": keys, "overrides": overrides}


def save_check(model, tok, folder: Path) -> dict:
    """``model`` and ``tok`` saved as a Hugging Face folder (safetensors in the model's dtype), timed."""
    start = time.perf_counter()
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    size = sum(f.stat().st_size for f in folder.glob("*.safetensors"))
    return {"seconds": round(time.perf_counter() - start, 1), "safetensors_gib": round(size / 2**30, 2)}


def load_and_eval_check(folder: Path, device: str, dtype: str, eval_args: list[str], out: Path,
                        eval_out: Path) -> dict:
    """``benchmarks/load_and_eval.py`` on the saved folder in a fresh process (its own peak memory):
    ``load_model`` and one ``posbias eval`` as a user types it."""
    command = [sys.executable, str(BENCHMARKS / "load_and_eval.py"), "--model", str(folder), "--device", device,
               "--dtype", dtype, "--out", str(out), "--eval-out", str(eval_out), "--", *eval_args]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"load_and_eval.py exited with {done.returncode}: "
                           + " | ".join(done.stderr.strip().splitlines()[-3:]))
    return json.loads(done.stdout.strip().splitlines()[-1])


def latency_check(config: str, device: str, lengths: str, reps: int, decode: int, out: Path) -> dict:
    import latency  # noqa: PLC0415 (script: benchmarks/ is put on sys.path above)

    return latency.main(["--random-config", config, "--device", device, "--dtype",
                         "bfloat16" if device.startswith("cuda") else "float32", "--lengths", lengths,
                         "--methods", "none,pi,lpes,ms-poe,attention-buckets,moice,temperature,positional-hidden",
                         "--reps", str(reps),
                         "--decode", str(decode), "--warmup", "1", "--out", str(out)])


def bam_check(device: str, out: Path, dry: bool) -> dict:
    import gpu_check_bam  # noqa: PLC0415 (script: benchmarks/ is put on sys.path above)

    args = ["--device", "cpu", "--backends", "eager,chunked", "--throughput-backends", ""] if dry else []
    return gpu_check_bam.main([*args, "--out", str(out)])


def markdown(report: dict) -> str:
    """The tables of ``report``: identity, latency ratios, search, BAM equivalence, peak memory, step
    times, and the steps that failed (a step missing from ``report`` leaves its table out)."""
    lines = [f"# GPU check: {report['model']} on {report['device_name']} ({report['dtype']})", ""]
    if "identity" in report:
        lines += equality_table(report["identity"], "identity: logits equal")
    if "latency" in report:
        lines += ["", *latency_lines(report["latency"])]
    if "search" in report:
        s = report["search"]
        lines += ["", f"Quick-preset search (kv, {s['num_keys']} keys): {s['seconds']} s, "
                  f"{s['generations']} generations."]
    if "load_and_eval" in report:
        lines += ["", load_and_eval_line(report)]
    if "shard" in report:
        lines += ["", f"`--device shard` over {', '.join(report['shard']['devices'])} against one device "
                  "(8-layer random Llama, each method at a real setting):", "",
                  *equality_table(report["shard"]["methods"], "logits equal")]
    if report.get("bam", {}).get("equivalence"):
        lines += ["", "BAM, largest relative difference to the reference backend (output and gradients):", "",
                  "| setup | backend | max rel diff |", "|---|---|---:|"]
        for setup, by_backend in report["bam"]["equivalence"].items():
            for backend, diffs in by_backend.items():
                lines.append(f"| {setup} | {backend} | {max(v['rel'] for v in diffs.values()):.3g} |")
    lines += ["", "Peak GPU memory (GiB): " + ", ".join(
        f"{k} {v:.1f}" if v is not None else f"{k} n/a" for k, v in report["peak_gib"].items()),
        "", "Step wall times (s): " + ", ".join(f"{k} {v:.0f}" for k, v in report["step_seconds"].items())]
    if report["errors"]:
        lines += ["", *(f"FAILED {step}: {err['message']}" for step, err in report["errors"].items())]
    if "seconds" in report:
        lines += ["", f"Wall time: {report['seconds']:.0f} s"]
    return "\n".join(lines) + "\n"


def equality_table(results: dict, column: str) -> list[str]:
    """``{method: compare_logits(...)}`` as a markdown table: method, equal (yes / NO), max abs diff."""
    return [f"| method | {column} | max abs diff |", "|---|---|---:|",
            *(f"| {m} | {'yes' if r['equal'] else 'NO'} | {r['max_abs_diff']:.3g} |" for m, r in results.items())]


def load_and_eval_line(report: dict) -> str:
    """The saved folder, its load and one eval, in a sentence."""
    load, ev = report["load_and_eval"]["load"], report["load_and_eval"]["eval"]
    save = report["save"]

    def on_gpu(gib) -> str:
        return "n/a" if gib is None else f"{gib} GiB"

    command = (f"posbias eval --model <folder> --device {report['device']} --dtype {report['dtype']} "
               + " ".join(report["plan"]["eval_args"]))
    return (f"Saved as a model folder ({save['safetensors_gib']} GiB of safetensors, {save['seconds']} s), then in "
            f"a fresh process: `load_model` {load['seconds']} s, {on_gpu(load['gpu_gib'])} on the GPU, "
            f"{load['dtype']} on {load['device']}, largest resident set {load['max_rss_gib']} GiB (mapped "
            f"safetensors pages included); `{command}` ({ev['instances']} instances, median "
            f"{ev['prompt_tokens_median']:.0f} prompt tokens): {ev['seconds']} s, peak {on_gpu(ev['peak_gpu_gib'])} "
            "on the GPU.")


def latency_lines(latency: dict) -> list[str]:
    """The latency ratios to ``none`` as a markdown table, one row per method."""
    lat = latency["summary"]
    lengths = list(next(iter(lat.values())))
    lines = ["Latency, ratio to none (median of per-repetition ratios; "
             f"{latency['reps_done']} repetitions, rotating order):", "",
             "| method | " + " | ".join(f"{n} prefill | {n} decode" for n in lengths) + " |",
             "|---|" + "---:|" * (2 * len(lengths))]
    for m, by_len in lat.items():
        cells = [f"{by_len[n]['prefill_ratio_rep_median']:.2f} | {by_len[n]['decode_ratio_rep_median']:.2f}"
                 for n in lengths]
        lines.append(f"| {m} | " + " | ".join(cells) + " |")
    return lines


def write_report(report: dict, out: Path) -> None:
    """``gpu_check.json`` and ``gpu_check.md`` in ``out``, each replaced atomically."""
    atomic_write_text(out / "gpu_check.json", json.dumps(report, indent=2, default=str))
    atomic_write_text(out / "gpu_check.md", markdown(report))


def run_step(report: dict, name: str, step, device: torch.device, out: Path) -> None:
    """``report[name] = step()``, with its wall time and peak GPU memory. A failure (an out-of-memory
    error, say) is recorded under ``report["errors"]`` with the end of its traceback and the next steps
    still run; the report files are rewritten after every step, so a run stopped by a time limit keeps
    what it measured."""
    reset_gpu_peaks()
    start = time.perf_counter()
    try:
        report[name] = step()
    except Exception as e:  # recorded in the report; the other steps still run
        report["errors"][name] = {"message": f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}",
                                  "traceback": traceback.format_exc(limit=-8)}
        print(f"step {name} FAILED: {report['errors'][name]['message']}", flush=True)
        if device.type == "cuda":
            torch.cuda.empty_cache()
    report["step_seconds"][name] = round(time.perf_counter() - start, 1)
    report["peak_gib"][name] = gpu_memory_gib(device, peak=True)
    print(f"step {name}: {report['step_seconds'][name]} s", flush=True)
    write_report(report, out)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="folder for gpu_check.json / .md and the scripts' files")
    ap.add_argument("--dry-run", action="store_true", help="CPU, tiny config, few tokens: checks the script")
    ap.add_argument("--skip-bam", action="store_true", help="leave out benchmarks/gpu_check_bam.py")
    a = ap.parse_args(argv)
    plan = DRY if a.dry_run else FULL
    if problems := unmet_requirements():
        raise SystemExit(f"error: this environment does not meet pyproject.toml: {'; '.join(problems)} "
                         "(a GPU node without network: see docs/guide/gpu.md)")
    if not a.dry_run and not torch.cuda.is_available():
        raise SystemExit("error: no CUDA device here; run with --dry-run to check the script on the CPU")
    import latency  # noqa: PLC0415 (script: benchmarks/ is put on sys.path above)

    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    device = torch.device(plan["device"])
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    start = time.perf_counter()
    report: dict = {"model": plan["config"], "device": str(device), "dtype": dtype_name(dtype),
                    "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU",
                    "torch": torch.__version__, "transformers": transformers.__version__, "plan": plan,
                    "peak_gib": {}, "step_seconds": {}, "errors": {}}
    holder: dict = {}

    def build_model() -> dict:
        holder["model"] = latency.random_model(plan["config"], str(device), dtype)
        return {"parameters": sum(p.numel() for p in holder["model"].parameters())}

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        tok = train_bpe_tokenizer(synthetic_task_texts(), 4096, tmp / "tokenizer")
        run_step(report, "weights", build_model, device, out)
        if "model" in holder:
            model = holder["model"]
            run_step(report, "identity", lambda: identity_checks(model, plan["identity_tokens"], tmp), device, out)
            run_step(report, "search", lambda: search_check(model, tok, plan["config"], tmp, plan["search_keys"],
                                                            plan["search_overrides"]), device, out)
            run_step(report, "save", lambda: save_check(model, tok, tmp / "model"), device, out)
            del model
        holder.clear()
        release_cached_memory(device)
        run_step(report, "latency", lambda: latency_check(plan["config"], str(device), plan["lengths"],
                                                          plan["reps"], plan["decode"], out / "latency.json"),
                 device, out)
        if not a.skip_bam:
            run_step(report, "bam", lambda: bam_check(str(device), out / "gpu_check_bam.json", a.dry_run), device,
                     out)
        if "save" in report:
            release_cached_memory(device)  # the fresh process needs the GPU memory this one has cached
            run_step(report, "load_and_eval", lambda: load_and_eval_check(
                tmp / "model", str(device), dtype_name(dtype), plan["eval_args"], out, tmp / "eval"), device, out)
        run_step(report, "shard", lambda: shard_check(tok, device, dtype, tmp / "shard"), device, out)
    report["seconds"] = time.perf_counter() - start
    write_report(report, out)
    print(markdown(report))
    if report["errors"]:
        raise SystemExit(f"error: {len(report['errors'])} step(s) failed: {', '.join(report['errors'])} "
                         f"(tracebacks in {out / 'gpu_check.json'})")
    return report


if __name__ == "__main__":
    main()
