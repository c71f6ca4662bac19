"""Where searched RoPE factors break a model with sliding-window layers: the gold log-prob of a needle
by prompt length, with the factors on every layer, on the sliding-window layers only and on the
full-attention layers only.

    python experiments/fixes-qwen-gemma/sliding_window.py --model gemma-3-270m \
        --factors lpes=docs/results/gemma-kv30/gemma-3-270m_kv30_seed0_factors.json \
        --lengths 400,600,1024,2048 --n 2 --out runs/fixes-qwen-gemma/sliding-window

A sliding-window layer (Gemma 3: window 512) attends to distances ``0 .. W - 1`` only; a factor
``s < 1`` rotates them as distances up to ``(W - 1) / s``, which the layer never saw in training. Below
the window's length a prompt cannot show it, so factors searched on short prompts look harmless there.

``--write-factors`` also writes those per-kind factors as files (``<label>_full_layers.json``, ...) for
``posbias compare --methods lpes --factors ...``; ``--lengths ""`` writes only them.

Rows: ``none``; per factors file ``label`` (the file applied as the ``lpes`` method, temperatures
included for a ``rope+temperature`` file), ``label, sliding layers`` and ``label, full layers`` (its RoPE
factors on those layers, 1 elsewhere). Instances: single-needle NIAH in essay filler (the task's own
generator), ``n`` per depth at depths 0 / 0.5 / 1, seed 0, eval split. Writes ``sliding_window.json``
(per instance) and ``sliding_window.md`` (gold log-prob per answer token and exact matches per length).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from posbias.evaluation.teacher_forced import score_teacher_forced
from posbias.methods import apply_method
from posbias.patching.rope_scaling import (
    apply_layer_scaling,
    factors_for_model,
    load_factors_file,
    save_factors_file,
)
from posbias.tasks.niah import make_niah
from posbias.utils.io import atomic_write_json, atomic_write_text
from posbias.utils.run_folder import git_commit

DEPTHS = (0.0, 0.5, 1.0)


KINDS = {"sliding": "sliding_attention", "full": "full_attention"}


def masked_factors(model, path: str, kind: str) -> list[float]:
    """The RoPE factors of ``path`` for ``model`` on the layers of ``kind`` (``sliding`` / ``full``), 1 elsewhere."""
    types = list(model.config.get_text_config().layer_types)
    factors = factors_for_model(load_factors_file(path), len(types), path=path)
    return [f if t == KINDS[kind] else 1.0 for f, t in zip(factors, types)]


def variants(model, files: dict[str, str]) -> dict[str, callable]:
    """``{row label: apply(model) -> handle}``: each file whole, on sliding layers only, on full layers only."""
    rows = {"none": None}
    for label, path in files.items():
        rows[label] = lambda m, p=path: apply_method(m, "lpes", factors=p)
        for kind in KINDS:
            rows[f"{label}, {kind} layers"] = lambda m, fs=masked_factors(model, path, kind): apply_layer_scaling(m, fs)
    return rows


def write_masked_files(model, files: dict[str, str], folder: Path) -> list[Path]:
    """``<label>_<kind>_layers.json`` per file and layer kind: factors files ``lpes`` applies (no curve)."""
    written = []
    for label, path in files.items():
        for kind in KINDS:
            target = folder / f"{label}_{kind}_layers.json"
            save_factors_file(target, factors=masked_factors(model, path, kind),
                              model=load_factors_file(path).get("model"), source=str(path),
                              layers=f"{kind}-attention layers only, 1 elsewhere")
            written.append(target)
    return written


def measure(model, tokenizer, files: dict[str, str], lengths: list[int], n: int) -> list[dict]:
    """One record per (length, row, instance): ``logprob`` (sum over the answer), ``n_tokens``, ``em``."""
    records = []
    rows = variants(model, files)
    for length in lengths:
        instances = make_niah(tokenizer=tokenizer, n=n, depths=list(DEPTHS), seed=0, split="eval",
                              haystack="essay", length=length)
        for label, apply in rows.items():
            handle = apply(model) if apply else None
            try:
                scores = score_teacher_forced(model, tokenizer, instances, batch_size=1)
            finally:
                if handle is not None:
                    handle.remove()
            for inst, s in zip(instances, scores):
                records.append({"length": length, "row": label, "id": inst.id, "depth": inst.depth,
                                "prompt_tokens": s["prompt_tokens"], "logprob": s["logprob"],
                                "n_tokens": s["n_tokens"], "em": bool(s["em"])})
            print(f"{length} tokens, {label}: {summary(records, length, label)}", flush=True)
    return records


def summary(records: list[dict], length: int, row: str) -> str:
    sel = [r for r in records if r["length"] == length and r["row"] == row]
    per_token = sum(r["logprob"] for r in sel) / sum(r["n_tokens"] for r in sel)
    return f"{per_token:.2f} ({sum(r['em'] for r in sel)}/{len(sel)})"


def table(records: list[dict]) -> str:
    lengths = sorted({r["length"] for r in records})
    rows = list(dict.fromkeys(r["row"] for r in records))
    prompt = {L: max(r["prompt_tokens"] for r in records if r["length"] == L) for L in lengths}
    head = "| factors on | " + " | ".join(f"{prompt[L]} tokens" for L in lengths) + " |"
    lines = [head, "|---|" + "---:|" * len(lengths)]
    lines += ["| " + row + " | " + " | ".join(summary(records, L, row) for L in lengths) + " |" for row in rows]
    return "\n".join(lines) + "\n\nGold log-prob per answer token (exact matches / instances).\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="gemma-3-270m")
    ap.add_argument("--factors", action="append", required=True, help="label=factors file (repeatable)")
    ap.add_argument("--lengths", default="400,600,1024,2048", help="NIAH prompt lengths in tokens")
    ap.add_argument("--n", type=int, default=2, help="instances per depth (depths 0, 0.5, 1)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--write-factors", action="store_true",
                    help="also write each file's factors on one layer kind only, as factors files in --out")
    args = ap.parse_args(argv)
    files = dict(item.split("=", 1) for item in args.factors)
    from posbias.models.loader import load_model  # noqa: PLC0415 (argument errors answer before torch loads)

    model, tokenizer = load_model(args.model)
    if "sliding_attention" not in (getattr(model.config.get_text_config(), "layer_types", None) or []):
        print(f"error: {args.model} has no sliding-window layers", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.write_factors:
        for path in write_masked_files(model, files, out):
            print(f"factors file: {path}")
    lengths = [int(x) for x in args.lengths.split(",") if x.strip()]
    if not lengths:
        return 0
    records = measure(model, tokenizer, files, lengths, args.n)
    atomic_write_json(out / "sliding_window.json", {"command": " ".join(sys.argv), "commit": git_commit(),
                                                    "model": args.model, "records": records})
    atomic_write_text(out / "sliding_window.md", table(records))
    print(table(records))
    return 0


if __name__ == "__main__":
    sys.exit(main())
