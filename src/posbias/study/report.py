"""The study's report: ``summary.md`` tables (training, accuracy by length, perplexity) and plots."""
from __future__ import annotations

import json
import math
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Sequence

from posbias.evaluation.compare import paired_cell
from posbias.evaluation.long_context import accuracy_by_length, instances_by_length, summarize_grid
from posbias.evaluation.stats import percent_cell, wilson_interval
from posbias.study.config import METRICS_FILE, SUMMARY_FILE, StudyConfig, read_models_file
from posbias.study.grid import PPL_FILE, TRAIN_PPL_FILE, VIEW_FILES
from posbias.study.plots import plot_accuracy_vs_length, plot_heatmap, plot_perplexity_vs_length, plot_probe_curves
from posbias.study.training import is_saved_model, model_dir_name
from posbias.utils.io import atomic_write_text, read_jsonl


def write_report(cfg: StudyConfig) -> list[dict]:
    """Aggregate the jsonl results into metrics.jsonl, summary.md and the PNGs; returns the metrics."""
    out = Path(cfg.out)
    schemes = _study_schemes(cfg)
    lengths = sorted({int(r["length"]) for _v, _t, f in VIEW_FILES for r in read_jsonl(out / f)}
                     | set(cfg.lengths))
    metrics: list[dict] = []
    sections = [_header(cfg)]
    logs = trainer_logs(out, schemes)
    training = training_table(out, logs)
    if training:
        sections.append(training)
    for view, _task, fname in VIEW_FILES:  # the view: passkey, passkey-essay, niah
        recs = [r for r in read_jsonl(out / fname) if r.get("model") in schemes and int(r["length"]) in lengths]
        if recs:
            sections += _grid_sections(cfg, view, recs, schemes, lengths, metrics)
    ppl = [r for r in read_jsonl(out / PPL_FILE) if r.get("model") in schemes]
    if ppl:
        sections.append(_perplexity_section(cfg, ppl, schemes, metrics))
        train_ppl = [r for r in read_jsonl(out / TRAIN_PPL_FILE) if r.get("model") in schemes]
        if train_ppl:
            sections.append(_memorisation_section(ppl, train_ppl, schemes, metrics))
    _plot_probes(cfg, logs)
    sections += _priors_sections(out, schemes) + _figures_section(out / "plots")
    atomic_write_text(out / METRICS_FILE, "".join(json.dumps(m) + "\n" for m in metrics))
    atomic_write_text(out / SUMMARY_FILE, "\n".join(sections))
    return metrics


def _plot_probes(cfg: StudyConfig, logs: dict[str, list[dict]]) -> None:
    """plots/training_probes.png: the 1x probes against the training step, when the trainer probed."""

    history = probe_history(logs)
    if history:
        plot_probe_curves(history, Path(cfg.out) / "plots" / "training_probes.png",
                          target=cfg.train_options.get("probe_target"))


def _study_schemes(cfg: StudyConfig) -> list[str]:
    """Every model of the study folder, not only this invocation's (a later run may add lengths for
    a few schemes only); this invocation's schemes first, in their order."""
    schemes = list(cfg.schemes)
    schemes += [m for m in read_models_file(cfg.out) if m not in schemes]
    return schemes


def _key_values(options: dict) -> str:
    """``{"b": 2, "a": 1}`` -> ``"a=1, b=2"``."""
    return ", ".join(f"{k}={v}" for k, v in sorted(options.items()))


def _model_options(cfg: StudyConfig) -> str:
    """``", model options: rope_theta=10000.0"`` (empty when every model keeps the preset's settings)."""
    return f", model options: {_key_values(cfg.model_options)}" if cfg.model_options else ""


def _n_beyond(cfg: StudyConfig) -> str:
    """``" (3 beyond 64x)"`` for ``--n-beyond 64=3``; empty without it."""
    if not cfg.n_beyond:
        return ""
    return " (" + ", ".join(f"{n} beyond {m:g}x" for m, n in sorted(cfg.n_beyond.items())) + ")"


def _header(cfg: StudyConfig) -> str:
    options = _key_values(cfg.train_options) or "none"
    text = (f"# Length-extrapolation study\n\npreset `{cfg.preset}`, training context {cfg.train_context}, "
            f"steps {cfg.train_steps or 'trainer default'}, seed {cfg.seed}, corpus "
            f"`{cfg.corpus or 'trainer default'}`, "
            f"tokenizer `{cfg.tokenizer or 'trainer default'}`, passkey rate {cfg.passkey_rate}, "
            f"NIAH rate {cfg.niah_rate}, training options: {options}{_model_options(cfg)}; n = {cfg.n} per cell"
            f"{_n_beyond(cfg)}, depths {cfg.depths}.\n")
    text += "\n" + _needles_note(cfg) + "\n"
    if cfg.dead_after:
        text += (f"\nBlank cells were not scored: `--dead-after {cfg.dead_after}` stops a scheme's grid after "
                 f"{cfg.dead_after} lengths in a row with no instance right, and a length that no invocation asked "
                 "of a scheme, or that an interrupted invocation had not reached, is blank too (`invocations.jsonl` "
                 "lists what each asked).\n")
    return text


def _grid_sections(cfg: StudyConfig, view: str, recs: list[dict], schemes: Sequence[str], lengths: Sequence[int],
                   metrics: list[dict]) -> list[str]:
    """One grid view (passkey / passkey-essay / niah): its cells and curves appended to ``metrics``,
    accuracy-vs-length plots and per-scheme heatmaps drawn, tables returned."""

    plots, sections = Path(cfg.out) / "plots", []
    cells = summarize_grid(recs)
    metrics += [{"kind": f"{view}_cell", **c} for c in cells]
    odd = sorted({(int(c["length"]), c["n"]) for c in cells if c["n"] != cfg.n_at(int(c["length"]))})
    if odd:  # cells of earlier invocations (other schemes / lengths) may hold fewer
        sections.append(f"Note ({view}): cells hold another number of instances than asked here at "
                        f"{', '.join(f'{L} tokens ({n}, not {cfg.n_at(L)})' for L, n in odd)} "
                        f"(see metrics.jsonl, kind {view}_cell, field n).\n")
    for mode, label in (("tf", "teacher-forced"), ("gen", "generation")):
        curves = accuracy_by_length(recs, mode=mode)
        if not curves:
            continue
        for m, by in curves.items():
            metrics += [{"kind": f"{view}_{mode}_by_length", "model": m, "length": L, "acc": a} for L, a in by.items()]
        plot_accuracy_vs_length(curves, plots / f"{view}_{mode}_accuracy_vs_length.png",
                                title=f"{view} accuracy ({label})", train_context=cfg.train_context)
        sizes_by = instances_by_length(recs, mode=mode)
        sections.append(accuracy_table(f"{view}, {label} accuracy (%), mean over depths [95% Wilson interval]",
                                        curves, schemes, lengths, cfg.train_context, sizes_by))
    paired = paired_schemes_table(view, recs, schemes, lengths, cfg.train_context)
    if paired:
        sections.append(paired)
    needles = failing_needles(recs, schemes)
    if needles:
        sections.append(f"Needles that fail ({view}, teacher-forced, at the lengths a scheme mostly solves):\n\n"
                        + "".join(f"- {line}\n" for line in needles))
    cost = _cost_table(f"{view}, seconds per instance (median) / peak memory (MB)", recs, schemes, lengths,
                       cfg.train_context)
    if cost:
        sections.append(cost)
    for m in schemes:
        rows = [c for c in cells if c["model"] == m]
        for value, label in (("tf_acc", "teacher-forced"), ("gen_acc", "generation")):
            if any(r[value] is not None for r in rows):
                plot_heatmap(rows, plots / f"{view}_heatmap_{model_dir_name(m)}_{value.split('_')[0]}.png",
                             title=f"{m}: {view} ({label})", value=value, train_context=cfg.train_context)
    return sections


def paired_schemes_table(view: str, recs: list[dict], schemes: Sequence[str], lengths: Sequence[int],
                         train_context: int) -> str:
    """Every scheme against a reference scheme (``ggd`` when the study has it, else the first) on the very
    same grid instances (a study asks every scheme the same instance ids at a length), teacher-forced:
    per length the instances gained / lost, the accuracy difference in points [95% interval] and the
    per-token gold log-prob difference (:func:`posbias.evaluation.compare.paired_cell`). "" with one scheme."""

    ref = "ggd" if "ggd" in schemes else (schemes[0] if schemes else None)
    by: dict[tuple[str, int], dict[str, dict]] = {}
    for r in recs:
        if "tf_em" in r:
            by.setdefault((r.get("model"), int(r["length"])), {})[r["id"]] = r
    rows = []
    for m in schemes:
        if m == ref or not any((m, L) in by for L in lengths):
            continue
        cells = []
        for L in lengths:
            base, other = by.get((ref, L), {}), by.get((m, L), {})
            ids = [i for i in base if i in other]
            cells.append(paired_cell(base, other, ids, correct_key="tf_em") if ids else "")
        rows.append((m, cells))
    if not rows:
        return ""
    note = ("Gained/lost instances, accuracy difference in points [95% interval], per-token gold log-prob "
            "difference +- 95% half-width; blank: not scored for both.\n")
    title = f"{view}, paired against {ref} (the same instances)"
    return length_table(title, lengths, train_context, rows) + "\n" + note


def failing_needles(recs: list[dict], schemes: Sequence[str], *, shown: int = 5) -> list[str]:
    """Whether failures follow the needle rather than its position: per scheme, over the lengths where
    its teacher-forced accuracy is >= 50%, the needles (answers) asked in two cells or more and wrong in
    more than half of them, and the share of all failures they hold. One line per scheme with such needles, e.g.
    ``ggd: 2 of 7 needles hold 28 of 31 failures: 4421141 (0/15 right), 4475955 (2/15 right)``."""


    curves = accuracy_by_length(recs, mode="tf")
    lines = []
    for m in schemes:
        solved = {L for L, a in curves.get(m, {}).items() if a >= 0.5}
        by_needle: dict[str, list[bool]] = defaultdict(list)
        for r in recs:
            if r.get("model") == m and int(r["length"]) in solved and "tf_em" in r:
                by_needle[", ".join(map(str, r["answers"]))].append(bool(r["tf_em"]))
        wrong = {k: v.count(False) for k, v in by_needle.items()}
        bad = sorted((k for k, v in by_needle.items() if len(v) >= 2 and wrong[k] > len(v) / 2),
                     key=lambda k: (-wrong[k], k))
        if bad:
            listed = ", ".join(f"{k} ({by_needle[k].count(True)}/{len(by_needle[k])} right)" for k in bad[:shown])
            more = f", and {len(bad) - shown} more" if len(bad) > shown else ""
            lines.append(f"{m}: {len(bad)} of {len(by_needle)} needles hold {sum(wrong[k] for k in bad)} of "
                         f"{sum(wrong.values())} failures: {listed}{more}")
    return lines


def _perplexity_section(cfg: StudyConfig, ppl: list[dict], schemes: Sequence[str], metrics: list[dict]) -> str:

    metrics += [{"kind": "perplexity", **{k: r[k] for k in ("model", "context", "mode", "ppl", "nll", "tokens")}}
                for r in ppl]
    plot_perplexity_vs_length(ppl, Path(cfg.out) / "plots" / "perplexity_vs_length.png",
                              train_context=cfg.train_context)
    return _ppl_table(ppl, schemes)


def _memorisation_section(ppl: list[dict], train_ppl: list[dict], schemes: Sequence[str], metrics: list[dict]) -> str:
    """Training-text vs held-out perplexity at the training context (non-overlapping), per scheme."""
    rows = ["## Perplexity on the training text vs the held-out text (training context, non-overlapping)\n",
            "A held-out / training ratio far above 1 is memorisation of the training corpus: the longer a "
            "scheme trained, the lower its training-text and the higher its held-out perplexity, so held-out "
            "perplexity then ranks schemes by their training length as much as by their attention.\n",
            "| scheme | training text | held-out text | held-out / training |", "|---|---|---|---|"]
    for m in schemes:
        train = next((r for r in train_ppl if r["model"] == m), None)
        held = next((r for r in ppl if r["model"] == m and r["mode"] == "non-overlapping"
                     and train and int(r["context"]) == int(train["context"])), None)
        if train is None or held is None:
            continue
        ratio = float(held["ppl"]) / float(train["ppl"])
        metrics.append({"kind": "perplexity_train", "model": m, "context": int(train["context"]),
                        "ppl_train": train["ppl"], "ppl_heldout": held["ppl"], "ratio": ratio})
        rows.append(f"| {m} | {_fmt_ppl(train['ppl'])} | {_fmt_ppl(held['ppl'])} | {ratio:.2f} |")
    return "\n".join(rows) + "\n"


def _priors_sections(out: Path, schemes: Sequence[str]) -> list[str]:
    sections = []
    for m in schemes:
        f = out / "priors" / f"{model_dir_name(m)}.md"
        if f.exists():
            sections.append(f"## Learned GGD priors: {m}\n\nbeta = theta_beta, alpha = exp(-theta_alpha / theta_beta) "
                            f"(bias = -|d/alpha|^beta); beta <= 0 marks a head without locality.\n\n{f.read_text()}")
    return sections


def _figures_section(plots: Path) -> list[str]:
    figs = sorted(p.name for p in plots.glob("*.png")) if plots.exists() else []
    return ["## Figures\n\n" + "\n".join(f"- plots/{p}" for p in figs) + "\n"] if figs else []


def _target_note(model_dir: Path, logged: list[dict]) -> str:
    """``", target 95% reached at step 1800 (3.69M tokens)"`` / ``", target 95% not reached"`` for a
    model trained with ``probe_target`` (stop once the probe holds the target), else ``""``; a model
    without its final weights yet is ``", still training"`` (a report written while it trains); one ended
    on purpose by the trainer's ``final_step`` says so (``", ended at step 2300 by final_step (4.71M tokens)"``)."""
    trained_to = max((r["step"] for r in logged if "loss" in r), default=0)
    # a stop still in force: a run resumed past an earlier final_step keeps that record but trained on
    stop = next((r for r in reversed(logged) if r.get("stopped_by") in ("probe_target", "final_step")
                 and r["step"] >= trained_to), None)
    if stop:
        where = f"step {stop['step']} ({stop['tokens'] / 1e6:.2f}M tokens)"
        if stop["stopped_by"] == "final_step":
            return f", ended at {where} by final_step"
        return f", target {100 * stop['probe_target']:.0f}% reached at {where}"
    if not is_saved_model(model_dir / "final"):
        return ", still training"
    cfg_file = model_dir / "config.json"
    target = json.loads(cfg_file.read_text()).get("config", {}).get("probe_target", 0) if cfg_file.exists() else 0
    return f", target {100 * target:.0f}% not reached" if target else ""


def trainer_logs(out: Path, schemes: Sequence[str]) -> dict[str, list[dict]]:
    """``{scheme: lines of <out>/models/<scheme>/metrics.jsonl}`` (empty for a scheme not trained in
    the study folder): read once, for :func:`training_table` and :func:`probe_history`."""
    return {m: read_jsonl(out / "models" / model_dir_name(m) / "metrics.jsonl") for m in schemes}


def probe_history(logs: dict[str, list[dict]]) -> dict[str, list[dict]]:
    """``{scheme: [{step, passkey_em, niah_em}, ...]}``: every probe at the training length in the
    trainer logs of :func:`trainer_logs` (``niah_em`` None where NIAH was not probed); schemes
    trained without ``probe_every`` are left out."""
    history = {}
    for m, logged in logs.items():
        probes = _probe_records(logged)
        if probes:
            history[m] = [{"step": r["step"], "passkey_em": r["passkey_em"], "niah_em": r.get("niah_em")}
                          for r in probes]
    return history


def _probe_records(logged: list[dict]) -> list[dict]:
    """The lines of a trainer's metrics.jsonl that are 1x probes (they carry ``passkey_em``)."""
    return [r for r in logged if r.get("passkey_em") is not None]


def _probe_scores(record: dict) -> str:
    """``"100% (-0.1)"`` for a passkey probe; ``"100% (-0.1), NIAH 90% (-0.4)"`` when NIAH was probed too."""
    text = f"{100 * record['passkey_em']:.0f}% ({record['passkey_logprob']:.1f})"
    if record.get("niah_em") is not None:
        text += f", NIAH {100 * record['niah_em']:.0f}% ({record['niah_logprob']:.1f})"
    return text


def training_table(out: Path, logs: dict[str, list[dict]]) -> str:
    """Final training loss (mean of the last 10% of logged steps), tokens and time per scheme, from
    the trainer logs of :func:`trainer_logs` (trainer runs inside the study folder ``out`` only; a
    resumed run counts the minutes of its last invocation only), plus the last passkey probe when
    the trainer ran with ``probe_every`` (retrieval at the training length)."""
    rows, probes = [], False
    for m, logged in logs.items():
        recs = [r for r in logged if "loss" in r]
        if not recs:
            continue
        tail = recs[-max(1, len(recs) // 10):]
        loss = sum(r["loss"] for r in tail) / len(tail)
        last = recs[-1]
        probe = _probe_records(logged)
        probes = probes or bool(probe)
        probe_cell = (f" {_probe_scores(probe[-1])}{_target_note(out / 'models' / model_dir_name(m), logged)} |"
                      if probe else " |")
        rows.append((f"| {m} | {last['step']} | {last.get('tokens', 0) / 1e6:.2f}M | {loss:.3f} | "
                     f"{last.get('elapsed_s', 0) / 60:.1f} |", probe_cell))
    if not rows:
        return ""
    head = "| scheme | steps | tokens | final loss | minutes (last invocation) |"
    rule = "|---|---|---|---|---|"
    if probes:
        head += " passkey probe at 1x: exact (log-prob) |"
        rule += "---|"
    return f"## Training\n\n{head}\n{rule}\n" + "\n".join(r + (c if probes else "") for r, c in rows) + "\n"


def _fmt_len(L: int, train_context: int) -> str:
    x = L / train_context
    return f"{L} ({x:g}x)"


def _needles_note(cfg: StudyConfig) -> str:
    """How many independent needles a length's accuracy holds (``needle_draw``)."""
    k = len(cfg.depths)
    if cfg.needle_draw == "per-depth":
        return (f"Needles drawn afresh at every depth: a length's {cfg.n * k} answers hold {cfg.n * k} "
                f"independent needles (`--needle-draw per-depth`).")
    return (f"The same {cfg.n} needles are asked at every depth (`--needle-draw shared`, a paired design): a "
            f"length's {cfg.n * k} answers hold {cfg.n} independent needles, so its Wilson interval (over "
            f"{cfg.n * k}) is too narrow when failures follow the needle rather than its depth.")


def accuracy_table(title: str, curves: dict, schemes: Sequence[str], lengths: Sequence[int], train_context: int,
                    sizes: dict[str, dict[int, int]] | None = None) -> str:
    """Accuracy (%) per scheme and length; with ``sizes`` (instances per cell) also its Wilson interval."""

    def cell(m, L):
        a = curves.get(m, {}).get(L)
        if a is None:
            return ""
        n = (sizes or {}).get(m, {}).get(L)
        if not n:
            return f"{100 * a:.0f}"
        lo, hi = wilson_interval(a * n, n)
        return percent_cell(a, lo, hi)

    return length_table(title, lengths, train_context, [(m, [cell(m, L) for L in lengths]) for m in schemes])


def length_table(title: str, lengths: Sequence[int], train_context: int, rows: list[tuple[str, list[str]]]) -> str:
    """A markdown section: one row per ``(scheme, cells)``, one column per length ("256 (1x)")."""
    head = "| scheme | " + " | ".join(_fmt_len(L, train_context) for L in lengths) + " |"
    lines = [f"| {name} | " + " | ".join(cells) + " |" for name, cells in rows]
    return f"## {title}\n\n" + "\n".join([head, "|---|" + "---|" * len(lengths), *lines]) + "\n"


def _cost_table(title: str, recs: list[dict], schemes: Sequence[str], lengths: Sequence[int],
                train_context: int) -> str:
    """Per scheme and length: the median of the records' ``seconds`` and the largest peak memory
    (``peak_gpu_mb`` on CUDA, else ``peak_rss_mb``); "" when no record carries them."""

    def cell(rows):
        secs = [r["seconds"] for r in rows if r.get("seconds") is not None]
        mem = [r.get("peak_gpu_mb", r.get("peak_rss_mb")) for r in rows]
        mem = [m for m in mem if m is not None]
        return (f"{statistics.median(secs):.3g}" if secs else "-") + " / " + (f"{max(mem):.0f}" if mem else "-")

    if not any(r.get("seconds") is not None for r in recs):
        return ""
    rows = []
    for m in schemes:
        by = {L: [r for r in recs if r.get("model") == m and int(r["length"]) == L] for L in lengths}
        if any(by.values()):
            rows.append((m, [cell(v) if v else "" for v in by.values()]))
    return length_table(title, lengths, train_context, rows)


def _ppl_table(rows: list[dict], schemes: Sequence[str]) -> str:
    contexts = sorted({int(r["context"]) for r in rows})
    parts = ["## Perplexity on held-out text (non-overlapping / sliding window, stride = context/2)\n"]
    head = "| scheme | " + " | ".join(str(c) for c in contexts) + " |"
    sep = "|---|" + "---|" * len(contexts)
    lines = [head, sep]
    for m in schemes:
        cells = []
        for c in contexts:
            v = {r["mode"]: r["ppl"] for r in rows if r["model"] == m and int(r["context"]) == c}
            cells.append(" / ".join(_fmt_ppl(v.get(k)) for k in ("non-overlapping", "sliding")))
        lines.append(f"| {m} | " + " | ".join(cells) + " |")
    return "\n".join(parts + lines) + "\n"


def _fmt_ppl(v) -> str:
    if v is None:
        return "-"
    v = float(v)
    if not math.isfinite(v):
        return "inf"
    return f"{v:.1f}" if v < 1e4 else f"{v:.1e}"
