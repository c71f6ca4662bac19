"""Resumable position-accuracy evaluation: score instances, log them, summarise by depth.

A run folder holds ``config.json`` (settings + versions), ``results.jsonl`` (one line per
instance, appended as soon as its batch is scored), ``summary.json`` / ``summary.md`` (accuracy by
depth with 95% Wilson intervals) and ``accuracy_by_depth.png``. Re-running into the same folder
skips instances already in ``results.jsonl``. Instances are scored round-robin over depths, so a
run stopped part-way has scored every depth about equally.
"""
from __future__ import annotations

import contextlib
import time
from itertools import zip_longest
from pathlib import Path
from typing import Any, Callable, Sequence

from posbias.evaluation.attention_probe import AttentionProbe
from posbias.evaluation.attention_summary import (
    attention_by_depth,
    format_attention_table,
    plot_attention,
    top1_by_layer,
)
from posbias.evaluation.batching import encode, model_max_positions
from posbias.evaluation.generation import generation_budget, greedy_generate, score_and_generate
from posbias.evaluation.metrics import score
from posbias.evaluation.modes import EVAL_MODES, GENERATE, TEACHER_FORCED
from posbias.evaluation.plots import plot_accuracy_by_depth
from posbias.evaluation.stats import accuracy_by_depth, format_table
from posbias.evaluation.teacher_forced import question_groups, score_instances, teacher_forced_fields, with_attention
from posbias.tasks.base import Instance, check_int
from posbias.utils.io import append_jsonl, atomic_write_json, atomic_write_text, read_jsonl, repair_jsonl
from posbias.utils.progress import progress_bar
from posbias.utils.run_folder import announce_resume

MODES = EVAL_MODES


def check_fits(model, tokenizer, instances: Sequence[Instance], chat: bool, extra_tokens: int = 0) -> int:
    """Raise a clear error before any work if an instance is longer than the model can hold.

    Returns the longest prompt + answer length in tokens."""
    limit = model_max_positions(model)
    longest = 0
    for inst in instances:
        e = encode(tokenizer, inst, chat, limit)
        longest = max(longest, len(e.prompt_ids) + len(e.answer_ids) + extra_tokens)
    if limit and longest > limit:
        raise ValueError(f"the longest instance needs {longest} positions; the model holds {limit}")
    return longest


def score_chunk(model, tokenizer, chunk: Sequence[Instance], *, mode: str, batch_size: int, chat: bool,
                max_new_tokens: int) -> list[dict]:
    """Score a chunk of instances; one record per instance with ``correct`` (the headline score).

    Per-instance fields are those of the study grid's records: ``tf_em, tf_logprob, n_tokens,
    prompt_tokens, tf_hits`` (teacher-forced; ``tf_hits``: 1 / 0 per answer token) and ``prediction,
    gen_score`` (generation). The questions of a shared context (``meta["context_id"]``) are scored from
    one prefill of it (:func:`~posbias.evaluation.teacher_forced.score_instances`)."""
    records = [{"id": i.id, "depth": i.depth, "gold_index": i.gold_index, "num_items": i.num_items,
                "answers": i.answers} for i in chunk]
    if mode == "both" and not any("context_id" in i.meta for i in chunk):
        both = score_and_generate(model, tokenizer, chunk, chat=chat, max_new_tokens=max_new_tokens)
        if both is not None:  # each prompt prefilled once for both scores
            return both_records(model, tokenizer, chunk, records, both, chat)
    if mode in (TEACHER_FORCED, "both"):
        for rec, r in zip(records, score_instances(model, tokenizer, chunk, batch_size=batch_size, chat=chat)):
            rec.update(teacher_forced_fields(r))
    if mode in (GENERATE, "both"):
        preds = greedy_generate(model, tokenizer, chunk, max_new_tokens=max_new_tokens, batch_size=batch_size,
                                chat=chat)
        for rec, inst, pred in zip(records, chunk, preds):
            rec.update(prediction=pred, gen_score=score(inst.metric, pred, inst.answers))
    for rec in records:
        rec["correct"] = float(rec["tf_em"]) if "tf_em" in rec else rec["gen_score"]
    return records


def both_records(model, tokenizer, chunk, records: list[dict], both: list[dict], chat: bool) -> list[dict]:
    """The records of ``mode="both"`` from :func:`~posbias.evaluation.generation.score_shared_prefill`'s results
    (teacher-forced fields, prediction), with the attention diagnostic where it is active."""
    tf = with_attention(model, tokenizer, chunk, [{"id": i.id, "em": b["tf_em"]} for i, b in zip(chunk, both)], chat)
    for rec, inst, b, t in zip(records, chunk, both, tf):
        rec.update(b, gen_score=score(inst.metric, b["prediction"], inst.answers),
                   **{k: v for k, v in t.items() if k.startswith("attn_")})
        rec["correct"] = float(rec["tf_em"])
    return records


def depth_interleaved(instances: Sequence[Instance]) -> list[Instance]:
    """The same instances ordered round-robin over depths: each depth's first, then each depth's second, ...

    Task generators emit instances depth by depth; scoring in this order instead means a run cut off
    after k instances has ~k / len(depths) at every depth, not all of the first depths and none of the
    last. Within a depth the generators' order is kept.
    """
    by_depth: dict[float, list[Instance]] = {}
    for inst in instances:
        by_depth.setdefault(inst.depth, []).append(inst)
    return [inst for row in zip_longest(*by_depth.values()) for inst in row if inst is not None]


def check_mode(mode: str) -> None:
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; choose one of {', '.join(MODES)}")


def check_attention(mode: str, attention: bool) -> None:
    """The attention diagnostic is taken while answers are teacher-forced: not in ``generate`` mode."""
    if attention and mode == GENERATE:
        raise ValueError("--attention is taken while answers are teacher-forced: use --mode teacher-forced or both")


def evaluate(model, tokenizer, instances: Sequence[Instance], out: str | Path, *, mode: str = "teacher-forced",
             batch_size: int = 8, chat: bool = False, max_new_tokens: int | None = None, label: str = "",
             progress: bool = True, before_write: Callable[[], Any] | None = None, attention: bool = False,
             prepare: Callable | None = None) -> dict:
    """Evaluate ``instances`` into the run folder ``out`` (resuming), return the summary dict.

    ``before_write`` is called before the first file is written (and may be called again): a
    :meth:`posbias.utils.run_folder.RunFolder.commit`, so the folder's config appears together with
    its first result, after every check (including the first batch's scoring) has passed.
    ``max_new_tokens`` None: enough for the longest gold answer of ``instances`` (all of them, so a
    resumed run generates under the same limit; :func:`~posbias.evaluation.generation.generation_budget`).
    ``attention``: every teacher-forced record also says where the last prompt position's attention went
    (:mod:`posbias.evaluation.attention_probe`); the summary gets ``attention_by_depth`` and ``attention.png``.
    ``prepare(model, tokenizer, chunk, chat=, batch_size=) -> chunk``: a method's step before each batch is
    scored (attention sorting re-shows the prompts); the records keep the ids and depths they were asked at.
    """
    check_mode(mode)
    check_attention(mode, attention)
    batch_size = check_int("batch_size", batch_size)
    if not instances:
        raise ValueError("no instances to evaluate")
    commit = before_write or (lambda: None)
    max_new_tokens = generation_budget(tokenizer, instances, max_new_tokens) if mode != TEACHER_FORCED else 0
    out = Path(out)
    results_path = out / "results.jsonl"
    repair_jsonl(results_path)
    done = {r["id"] for r in read_jsonl(results_path, key="id")}
    todo = depth_interleaved([i for i in instances if i.id not in done])
    if len(todo) < len(instances):

        announce_resume(len(instances) - len(todo), len(instances), "instances", out)
    if todo:
        check_fits(model, tokenizer, todo, chat, max_new_tokens)
    start = time.time()
    bar = progress_bar(len(instances), initial=len(instances) - len(todo), desc=label or "eval", unit="inst",
                       enabled=progress)
    with AttentionProbe(model) if attention and todo else contextlib.nullcontext():
        for chunk in question_groups(todo, batch_size, shared=True):  # a shared context's questions together
            chunk_start = time.time()
            shown = prepare(model, tokenizer, chunk, chat=chat, batch_size=batch_size) if prepare else chunk
            records = score_chunk(model, tokenizer, shown, mode=mode, batch_size=batch_size, chat=chat,
                                  max_new_tokens=max_new_tokens)
            for rec, inst in zip(records, shown):
                if "original_gold_index" in inst.meta:
                    rec["original_gold_index"] = inst.meta["original_gold_index"]
            commit()
            for rec in records:  # seconds: the batch's wall time per instance (a resumed run keeps earlier ones)
                append_jsonl(results_path, {**rec, "seconds": (time.time() - chunk_start) / len(chunk)})
            bar.update(len(chunk))
    bar.close()
    commit()
    return summarise(out, instances, mode=mode, label=label, seconds=time.time() - start)


def summarise(out: Path, instances: Sequence[Instance], *, mode: str, label: str, seconds: float) -> dict:
    """Write summary.json, summary.md and the depth plot from ``results.jsonl``."""
    wanted = {i.id for i in instances}
    records = [r for r in read_jsonl(out / "results.jsonl", key="id") if r["id"] in wanted]
    rows = accuracy_by_depth(records)
    summary = {"label": label, "mode": mode, "n_instances": len(records), "by_depth": rows,
               "overall": sum(r["correct"] for r in records) / max(1, len(records)),
               "seconds_this_invocation": round(seconds, 1)}
    if mode == "both":
        summary["by_depth_generate"] = accuracy_by_depth(records, key="gen_score")
        summary["tf_vs_generate_agreement"] = sum(
            float(r["tf_em"]) == float(r["gen_score"] >= 1.0) for r in records) / max(1, len(records))
    attention = attention_by_depth(records)
    if attention:
        summary["attention_by_depth"] = attention
        summary["attention_top1_by_layer"] = top1_by_layer(records)
    atomic_write_json(out / "summary.json", summary)
    table = format_table(rows, title=f"{label} ({mode})")
    if mode == "both":
        table += "\n\n" + format_table(summary["by_depth_generate"], title=f"{label} (greedy generation)")
    if attention:
        table += "\n\n" + format_attention_table(attention, title=f"{label}: where the last prompt position's "
                                                                  "attention went")
        plot_attention(attention, summary["attention_top1_by_layer"], out / "attention.png", title=label)
    atomic_write_text(out / "summary.md", table + "\n")
    curves = {f"{label or 'model'} ({mode if mode != 'both' else 'teacher-forced'})": rows}
    if mode == "both":
        curves[f"{label or 'model'} (generate)"] = summary["by_depth_generate"]
    plot_accuracy_by_depth(curves, out / "accuracy_by_depth.png", title=label)
    return summary
