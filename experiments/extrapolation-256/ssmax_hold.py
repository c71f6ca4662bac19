"""Why does SSMax hurt GGD beyond the training length here? One training-free test of one cause.

SSMax multiplies a query's logits by ``s_h log n_i``. At the training context ``T`` that multiplier
never exceeds ``s_h log T``; at 64x it is ``log(64 T) / log T`` times larger (1.75x for T = 256), a
range the model never saw. This script evaluates a study's SSMax model with the multiplier *held*
at its training-length value (``SSMax.max_keys = T``: counts above ``T`` count as ``T``) on the
study's own instances (same seed, lengths, depths, n; passkey, and with ``--niah`` the NIAH view), and
pairs it with the study's records::

    python experiments/extrapolation-256/ssmax_hold.py --study runs/study --scheme ggd+ssmax --multipliers 4,8,16,32 \
        --out runs/ssmax-hold

If holding the multiplier restores accuracy, the collapse comes from the multiplier leaving its
training range; if not, from what the model learned with SSMax at the training length. Writes
``<out>/passkey.jsonl`` (the held model's records, resumable) and ``<out>/summary.md``.
"""
from __future__ import annotations

import argparse
from pathlib import Path

from posbias.attention import SSMax
from posbias.evaluation.stats import percent_cell, wilson_interval
from posbias.study.config import StudyConfig
from posbias.study.grid import NIAH_FILE, PASSKEY_FILE, evaluate_model
from posbias.study.seeds import load_study
from posbias.study.training import load_trained
from posbias.utils.io import atomic_write_text, read_jsonl


def hold_multiplier(model, max_keys: int) -> int:
    """Set ``max_keys`` on every SSMax module of ``model``; returns how many were set (0: no SSMax)."""

    modules = [m for m in model.modules() if isinstance(m, SSMax)]
    for m in modules:
        m.max_keys = int(max_keys)
    return len(modules)


def paired_table(study_recs: list[dict], held_recs: list[dict], lengths: list[int], context: int) -> str:
    """Per length: study accuracy, held accuracy (95% Wilson), and instances gained / lost."""
    base = {(int(r["length"]), r["id"]): bool(r["tf_em"]) for r in study_recs}
    lines = ["| length | as trained | multiplier held at the training length | gained / lost |", "|---|---|---|---|"]
    for L in lengths:
        pairs = [(base[(L, r["id"])], bool(r["tf_em"])) for r in held_recs
                 if int(r["length"]) == L and (L, r["id"]) in base]
        if not pairs:
            continue
        cells = []
        for col in (0, 1):
            k = sum(p[col] for p in pairs)
            lo, hi = wilson_interval(k, len(pairs))
            cells.append(percent_cell(k / len(pairs), lo, hi))
        gained = sum(1 for a, b in pairs if b and not a)
        lost = sum(1 for a, b in pairs if a and not b)
        lines.append(f"| {L} ({L / context:g}x) | {cells[0]} | {cells[1]} | +{gained} / -{lost} (n = {len(pairs)}) |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> str:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--study", required=True, help="a study folder holding the scheme's model and passkey records")
    ap.add_argument("--scheme", default="ggd+ssmax")
    ap.add_argument("--multipliers", default="4,8,16,32", help="lengths as multiples of the training context")
    ap.add_argument("--niah", action="store_true", help="also the study's NIAH view (RULER single_1, noise haystack)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    study = load_study(args.study)
    cfg, out = study.config, Path(args.out)
    context = int(cfg["train_context"])
    models = study.models
    if args.scheme not in models:
        raise SystemExit(f"{args.study} has no trained model for {args.scheme!r} (it has: {', '.join(models)})")
    model, tok = load_trained(study.path / models[args.scheme], "cpu")
    if not hold_multiplier(model, context):
        raise SystemExit(f"{args.scheme} has no SSMax: nothing to hold")
    grid = StudyConfig(out=str(out), train_context=context, multipliers=[float(x) for x in args.multipliers.split(",")],
                       depths=cfg["depths"], n=cfg["n"], seed=cfg["seed"], modes=["teacher-forced"], niah=args.niah,
                       niah_options=cfg.get("niah_options") or {}, ppl_multipliers=[])
    lengths = grid.lengths
    name = f"{args.scheme}@max_keys={context}"
    evaluate_model(model, tok, grid, name=name, extra={"scheme": args.scheme, "max_keys": context})
    text = (f"# {args.scheme}: SSMax multiplier held at the training length ({context} keys)\n\n"
            f"Study `{args.study}` (seed {cfg['seed']}), teacher-forced exact match, the study's own "
            f"instances, paired.\n")
    for view, fname in (("passkey", PASSKEY_FILE), ("niah", NIAH_FILE))[: 2 if args.niah else 1]:
        study_recs = [r for r in read_jsonl(study.path / fname) if r.get("model") == args.scheme]
        held = [r for r in read_jsonl(out / fname) if r.get("model") == name]
        text += f"\n## {view}\n\n" + paired_table(study_recs, held, lengths, context)
    atomic_write_text(out / "summary.md", text)
    print(text)
    return text


if __name__ == "__main__":
    main()
