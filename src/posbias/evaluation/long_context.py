"""Passkey / NIAH retrieval over a grid of input lengths x needle depths, resumable.

For every length, ``n`` seeded instances per depth are built with
``posbias.tasks.make_instances(task, tokenizer=..., n=n, depths=depths, seed=seed,
split="eval", length=length, **task_kwargs)`` and scored two ways:

* **teacher-forced** (the BAM reference's passkey score): one forward pass over prompt + gold
  answer; correct when the argmax at *every* answer-token position equals the gold token
  (``posbias.evaluation.teacher_forced.score_teacher_forced``; only the answer positions'
  logits are computed, via ``logits_to_keep``);
* **greedy generation**: the completion is scored with the instance's metric (``passkey`` for
  the passkey task, ``string_match_all`` for NIAH) by ``posbias.evaluation.metrics.score``.

Every instance's result is appended as one line to a jsonl file, keyed by
``(model, task, length, instance id)`` (an instance id names task, split, seed, depth and index); a rerun skips the
keys already there, so a grid killed
at any point resumes where it stopped. With both modes, each instance is prefilled once and
both scores come from that prefill (:func:`score_shared_prefill`; tested equal to the two-pass
scorers), at batch size 1; a single mode runs the batched scorers with the batch capped so that
``batch_size * length <= token_budget``.

Lengths beyond ``config.max_position_embeddings`` raise :class:`LengthBeyondModelError` unless the
model says it extrapolates (``config.extrapolates``, set by every BAM config) or
``allow_extrapolation=True`` is passed.
"""
from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Sequence

import torch

from posbias.architecture.layers import model_device
from posbias.evaluation.batching import model_max_positions
from posbias.evaluation.generation import generation_budget, greedy_generate, score_shared_prefill
from posbias.evaluation.metrics import score
from posbias.evaluation.modes import GRID_MODES, TEACHER_FORCED, canonical_mode
from posbias.evaluation.teacher_forced import score_teacher_forced, teacher_forced_fields
from posbias.tasks import make_instances
from posbias.tasks.base import depth_seed
from posbias.utils.io import append_jsonl, read_jsonl
from posbias.utils.memory import peak_rss_mb, reset_peak_rss
from posbias.utils.progress import progress_bar

MODES = GRID_MODES


class LengthBeyondModelError(ValueError):
    """A grid length longer than a model with limited positions can hold."""


def supports_extrapolation(model) -> bool:
    """True for a model whose config says it runs at any length (``config.extrapolates``; every BAM
    config does, whatever its scheme)."""
    return bool(getattr(getattr(model, "config", None), "extrapolates", False))


def check_lengths(model, lengths: Iterable[int], *, allow_extrapolation: bool | None = None) -> None:
    """Raise :class:`LengthBeyondModelError` for a length the model cannot run at.

    A model with ``max_position_embeddings`` (learned or otherwise limited positions) cannot be
    evaluated beyond it unless it supports extrapolation or ``allow_extrapolation`` is True.
    """
    if allow_extrapolation or supports_extrapolation(model):
        return

    limit = model_max_positions(model)  # the one max-length rule (0: no limit)
    if not limit:
        return
    too_long = sorted(int(L) for L in lengths if int(L) > limit)
    if too_long:
        raise LengthBeyondModelError(
            f"{type(model).__name__} ({getattr(model.config, 'model_type', '?')}) holds at most {limit} positions, "
            f"but the grid asks for lengths {too_long}; drop those lengths, or pass allow_extrapolation=True "
            "to run past the configured limit anyway"
        )


def _default_make_instances():

    return make_instances


NEEDLE_DRAWS = ("shared", "per-depth")


def grid_instances(tokenizer, *, task: str, length: int, depths: Sequence[float], n: int, seed: int,
                   make_instances: Callable | None = None, task_kwargs: dict | None = None,
                   needle_draw: str = "shared") -> list:
    """The ``n`` seeded instances of every depth at one length.

    ``needle_draw="shared"``: one generator call per length; the same ``n`` needles (keys, values,
    filler) are asked at every depth (a paired design across depths: a cell's ``n x len(depths)``
    answers hold only ``n`` independent needles). ``"per-depth"``: every depth draws its own ``n``
    needles from :func:`posbias.tasks.base.depth_seed` (``n x len(depths)`` independent ones;
    a depth's instances do not depend on which other depths are asked).
    """
    check_needle_draw(needle_draw)
    make = make_instances or _default_make_instances()
    if needle_draw == "shared":
        calls = [([float(d) for d in depths], seed)]
    else:

        calls = [([float(d)], depth_seed(seed, d)) for d in depths]
    return [inst for ds, s in calls
            for inst in make(task, tokenizer=tokenizer, n=n, depths=ds, seed=s, split="eval", length=int(length),
                             **(task_kwargs or {}))]


def check_needle_draw(needle_draw: str) -> None:
    if needle_draw not in NEEDLE_DRAWS:
        raise ValueError(f"needle draw {needle_draw!r} is not one of {', '.join(NEEDLE_DRAWS)}")


def record_key(rec: dict) -> tuple:
    return (rec["model"], rec["task"], int(rec["length"]), rec["id"])


@dataclass
class GridSpec:
    """What :func:`run_grid` scores: ``task`` at ``lengths x depths``, ``n`` instances per cell.

    Attributes:
        task: ``"passkey"`` or ``"niah"`` (anything ``posbias.tasks.make_instances`` knows);
            ``task_kwargs``: extra arguments for its generator (e.g. ``haystack="essay"``).
        lengths: input lengths in tokens (passed to the task generator as ``length``).
        depths: relative needle depths in [0, 1]; ``n``: instances per cell; ``seed``: their seed.
        modes: subset of ``("teacher-forced", "generate")`` (``teacher_forced`` is accepted).
        batch_size: upper bound for the two-pass scorers; the actual batch is
            ``min(batch_size, token_budget // length)`` (at least 1), so long inputs run one at a time.
        max_new_tokens: generation budget (default: answer tokens + 4, per cell).
        allow_extrapolation: score lengths beyond the model's positions (None: what the model says).
        chat: wrap prompts in the tokenizer's chat template (default False: the study's models are
            trained from scratch; the raw text ``prompt + " " + answer_prefix`` is the format of
            the trainer's synthetic passkey documents).
        shared_prefill: with both modes, score each instance (batch size 1) for both from one
            prefill (:func:`score_shared_prefill`, half the cost of the two-pass scorers, which
            ``shared_prefill=False`` uses, batched).
        needle_draw: ``"shared"`` (the same ``n`` needles at every depth) or ``"per-depth"``
            (``n`` fresh needles per depth); see :func:`grid_instances`.
    """

    lengths: Sequence[int]
    depths: Sequence[float]
    task: str = "passkey"
    n: int = 5
    seed: int = 0
    modes: Sequence[str] = MODES
    batch_size: int = 4
    token_budget: int = 8192
    max_new_tokens: int | None = None
    task_kwargs: dict = field(default_factory=dict)
    allow_extrapolation: bool | None = None
    chat: bool = False
    shared_prefill: bool = True
    needle_draw: str = "shared"


def run_grid(model, tokenizer, spec: GridSpec, *, model_name: str, out_jsonl: str | Path,
             make_instances: Callable | None = None, extra: dict | None = None, progress: bool = True) -> list[dict]:
    """Evaluate ``model`` on the grid of ``spec``; returns all records of this model/task.

    Args:
        model_name: the model's name in the records (the resume key includes it).
        out_jsonl: results file; one line per instance, appended as soon as it is scored.
        make_instances: a replacement for ``posbias.tasks.make_instances`` (tests).
        extra: constant fields added to every record (e.g. the positional scheme).

    Each record: ``model, task, length, depth, id, prompt_tokens, answers`` plus
    ``tf_em, tf_logprob, n_tokens`` (teacher-forced) and ``prediction, gen_score`` (generation).
    """
    task, depths, n, seed, modes = spec.task, spec.depths, spec.n, spec.seed, spec.modes
    needle_draw, batch_size, token_budget = spec.needle_draw, spec.batch_size, spec.token_budget
    modes = [canonical_mode(m) for m in modes]
    check_needle_draw(needle_draw)
    unknown = set(modes) - set(MODES)
    if unknown:
        raise ValueError(f"unknown grid modes {sorted(unknown)}; known: {', '.join(MODES)}")
    lengths = sorted({int(L) for L in spec.lengths})
    check_lengths(model, lengths, allow_extrapolation=spec.allow_extrapolation)
    shared = spec.shared_prefill and set(modes) == set(MODES)
    out_jsonl = Path(out_jsonl)
    existing = [r for r in read_jsonl(out_jsonl) if r.get("model") == model_name and r.get("task") == task]
    done = {record_key(r) for r in existing}
    records = list(existing)


    total = len(lengths) * len(depths) * n
    resumed = min(total, sum(1 for key in done if key[2] in lengths))  # this call's lengths only
    # ``initial=`` (not a later ``update``, which tqdm does not draw within its refresh interval)
    # so a resumed run shows what it already holds from the first line
    bar = progress_bar(total, initial=resumed, desc=f"{model_name} {task}", unit="inst", enabled=progress)
    try:
        for length in lengths:
            bs = 1 if shared else max(1, min(batch_size, token_budget // max(1, length)))
            insts = grid_instances(tokenizer, task=task, length=length, depths=depths, n=n, seed=seed,
                                   make_instances=make_instances, task_kwargs=spec.task_kwargs, needle_draw=needle_draw)
            todo = [i for i in insts if (model_name, task, length, i.id) not in done]
            for start in range(0, len(todo), bs):
                chunk = todo[start:start + bs]
                t0 = time.perf_counter()
                _reset_peak(model)
                new = _score_chunk(model, tokenizer, chunk, modes=modes, batch_size=bs,
                                   max_new_tokens=spec.max_new_tokens, chat=spec.chat,
                                   shared_prefill=spec.shared_prefill)
                cost = {"seconds": round((time.perf_counter() - t0) / len(chunk), 3), **_peak_memory(model)}
                for inst, res in zip(chunk, new):
                    rec = {"model": model_name, "task": task, "length": length, "depth": float(inst.depth),
                           **(extra or {}), **res, **cost}
                    append_jsonl(out_jsonl, rec)
                    done.add(record_key(rec))
                    records.append(rec)
                bar.update(len(chunk))
    finally:
        bar.close()
    return records


def _reset_peak(model) -> None:
    dev = model_device(model)
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
    else:
        reset_peak_rss()


def _peak_memory(model) -> dict:
    """``peak_gpu_mb`` (this chunk's peak on CUDA) or ``peak_rss_mb`` (resident memory: this chunk's
    peak on Linux, see :func:`posbias.utils.memory.peak_rss_mb`; elsewhere the process's peak so far,
    which bounds the chunk's because the grid runs lengths in increasing order)."""
    dev = model_device(model)
    if dev.type == "cuda":
        return {"peak_gpu_mb": round(torch.cuda.max_memory_allocated(dev) / 2**20, 1)}
    return {"peak_rss_mb": round(peak_rss_mb(), 1)}


def _score_chunk(model, tokenizer, chunk: list, *, modes: Sequence[str], batch_size: int,
                 max_new_tokens: int | None, chat: bool, shared_prefill: bool = True) -> list[dict]:

    if shared_prefill and len(chunk) == 1 and set(modes) == set(MODES):
        inst = chunk[0]
        budget = generation_budget(tokenizer, [inst], max_new_tokens or None, floor=0)
        res = score_shared_prefill(model, tokenizer, inst, chat=chat, max_new_tokens=budget)
        if res is not None:
            return [{"id": inst.id, "answers": list(inst.answers), "metric": inst.metric, **res,
                     "gen_score": float(score(inst.metric, res["prediction"], inst.answers))}]
    out = [{"id": inst.id, "answers": list(inst.answers), "metric": inst.metric} for inst in chunk]
    if TEACHER_FORCED in modes:

        for o, r in zip(out, score_teacher_forced(model, tokenizer, chunk, batch_size=batch_size, chat=chat)):
            o.update(teacher_forced_fields(r))
    if "generate" in modes:

        budget = generation_budget(tokenizer, chunk, max_new_tokens or None, floor=0)
        preds = greedy_generate(model, tokenizer, chunk, max_new_tokens=budget, batch_size=batch_size,
                                chat=chat)
        for o, inst, p in zip(out, chunk, preds):
            o.update(prediction=p, gen_score=float(score(inst.metric, p, inst.answers)))
    return out


def summarize_grid(records: Iterable[dict]) -> list[dict]:
    """Mean accuracy per ``(model, task, length, target depth)`` cell.

    Returns rows ``{model, task, length, depth, n, tf_acc, gen_acc}`` (an accuracy is None when
    that mode was not run), sorted by model, task, length, depth.
    """
    cells: dict[tuple, list[dict]] = defaultdict(list)
    for r in records:
        cells[(r["model"], r["task"], int(r["length"]), float(r["depth"]))].append(r)
    rows = []
    for (m, t, L, d), rs in sorted(cells.items()):
        tf = [float(r["tf_em"]) for r in rs if "tf_em" in r]
        gen = [float(r["gen_score"]) for r in rs if "gen_score" in r]
        rows.append({"model": m, "task": t, "length": L, "depth": d, "n": len(rs),
                     "tf_acc": sum(tf) / len(tf) if tf else None,
                     "gen_acc": sum(gen) / len(gen) if gen else None})
    return rows


def accuracy_by_length(records: Iterable[dict], *, mode: str = "tf") -> dict[str, dict[int, float]]:
    """``{model: {length: accuracy averaged over depths and instances}}`` for ``mode`` "tf"/"gen"."""
    key = "tf_em" if mode == "tf" else "gen_score"
    acc: dict[str, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    for r in records:
        if key in r:
            acc[r["model"]][int(r["length"])].append(float(r[key]))
    return {m: {L: sum(v) / len(v) for L, v in sorted(by.items())} for m, by in acc.items()}


def instances_by_length(records: Iterable[dict], *, mode: str = "tf") -> dict[str, dict[int, int]]:
    """``{model: {length: instances}}``: the denominators of :func:`accuracy_by_length` (same records)."""
    key = "tf_em" if mode == "tf" else "gen_score"
    out: dict[str, dict[int, int]] = defaultdict(lambda: defaultdict(int))
    for r in records:
        if key in r:
            out[r["model"]][int(r["length"])] += 1
    return {m: dict(by) for m, by in out.items()}
