"""What loading a model and one ``posbias eval`` cost on a device: wall time, GPU memory, CPU memory.

    python benchmarks/load_and_eval.py --model Qwen/Qwen2.5-7B-Instruct --device cuda --dtype bfloat16 \\
        --out runs/load_and_eval -- --task kv --num-keys 100 --n 10 --depths 0,0.5,1

In one fresh process (run it as a script, so that the process-wide figures are its own):

1. ``load_model`` with ``--device`` / ``--dtype``: seconds, the GPU memory the weights take, the
   parameters' dtype and device;
2. the model is freed, then ``posbias eval --model ... --device ... --dtype ...`` with the arguments
   after ``--`` and ``--out`` ``--eval-out`` (default ``<out>/eval``), through the command line's own
   entry: seconds, peak GPU memory, the median prompt length of its instances.

The process's largest resident set (``VmHWM``, :func:`posbias.utils.memory.peak_rss_mb`) is read after
each step; it counts the pages of the memory-mapped safetensors files the loader touched, so it is an
upper bound of the CPU memory a load needs, not a measure of a float32 copy. ``<out>/load_and_eval.json``
receives the figures, and the last line printed is the same JSON.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

from posbias.cli.main import app
from posbias.models.loader import load_model
from posbias.models.options import LoadOptions
from posbias.utils.io import atomic_write_json, read_jsonl
from posbias.utils.memory import gpu_memory_gib, peak_rss_mb, release_cached_memory, reset_gpu_peaks


def gib(n_bytes: float) -> float:
    return round(n_bytes / 2**30, 2)


def max_rss_gib() -> float:
    """The process's largest resident set so far (:func:`posbias.utils.memory.peak_rss_mb`)."""
    return gib(peak_rss_mb() * 2**20)


def gpu_gib(device: torch.device, peak: bool = False) -> float | None:
    """:func:`posbias.utils.memory.gpu_memory_gib`, rounded."""
    value = gpu_memory_gib(device, peak=peak)
    return None if value is None else round(value, 2)


def measure_load(model: str, options: LoadOptions) -> dict:
    """``load_model`` timed; the model is freed before this returns."""
    start = time.perf_counter()
    loaded, _ = load_model(model, options)
    param = next(loaded.parameters())
    record = {"seconds": round(time.perf_counter() - start, 1), "gpu_gib": gpu_gib(param.device),
              "parameters": sum(p.numel() for p in loaded.parameters()), "dtype": str(param.dtype),
              "device": str(param.device), "max_rss_gib": max_rss_gib()}
    del loaded, param
    return record


def measure_eval(model: str, options: LoadOptions, eval_args: list[str], out: Path) -> dict:
    """``posbias eval`` through the command line's entry, timed, with its peak GPU memory."""
    device = options.placement().device
    release_cached_memory(device)  # the loaded model of measure_load, before the peak is reset
    reset_gpu_peaks()
    command = ["eval", "--model", model, "--device", options.device, "--dtype", options.dtype, *eval_args,
               "--out", str(out)]
    start = time.perf_counter()
    app(command, standalone_mode=False)  # bad input: its one line, exit status 2
    seconds = round(time.perf_counter() - start, 1)
    rows = read_jsonl(out / "results.jsonl")
    return {"command": "posbias " + " ".join(command), "seconds": seconds, "peak_gpu_gib": gpu_gib(device, peak=True),
            "instances": len(rows), "prompt_tokens_median": statistics.median(r["prompt_tokens"] for r in rows),
            "max_rss_gib": max_rss_gib()}


def main(argv: list[str] | None = None) -> dict:
    argv = list(sys.argv[1:] if argv is None else argv)
    eval_args = argv[argv.index("--") + 1:] if "--" in argv else []
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True, help="model folder, .gguf file, Hub id or alias")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--out", required=True, help="folder for load_and_eval.json")
    ap.add_argument("--eval-out", default=None, help="the eval's run folder (default: <out>/eval); give a new one "
                                                     "each time, since an existing run folder is resumed")
    a = ap.parse_args(argv[: argv.index("--")] if "--" in argv else argv)
    options = LoadOptions(a.device, a.dtype)
    try:
        options.placement()  # an unusable device or dtype: one line, before anything is written
    except ValueError as e:
        raise SystemExit(f"error: {e}") from None
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    report = {"model": a.model, "device": a.device, "dtype": a.dtype, "load": measure_load(a.model, options)}
    report["eval"] = measure_eval(a.model, options, eval_args or ["--task", "kv", "--n", "2"],
                                  Path(a.eval_out) if a.eval_out else out / "eval")
    atomic_write_json(out / "load_and_eval.json", report)
    print(json.dumps(report))
    return report


if __name__ == "__main__":
    main()
