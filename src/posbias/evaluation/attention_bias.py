"""The positional attention bias of a task's prompts: how much attention the position that predicts the answer
pays, per token, to a record that is *not* the answer, at each record slot (Hsieh et al. 2024's ``Attn(x_dum,
k)``; the cheaper variant of their dummy documents: the non-gold records of real prompts, averaged).

``posbias attention-bias`` scores prompts of the search split under the attention diagnostic (every record's
per-token attention, averaged over layers and heads), keeps one line per prompt in ``results.jsonl`` (a rerun
resumes) and writes ``attention_bias.json`` (what ``--method calibration@bias=...`` reads) and
``attention_bias.png`` (the bias by slot: the attention basin).
"""
from __future__ import annotations

import statistics
from pathlib import Path
from typing import Sequence

from posbias.evaluation.attention_probe import AttentionProbe
from posbias.evaluation.teacher_forced import question_groups, score_instances
from posbias.methods.calibration import BIAS_FORMAT
from posbias.utils.figures import pyplot, save_figure
from posbias.utils.io import append_jsonl, atomic_write_json, read_jsonl, repair_jsonl
from posbias.utils.progress import progress_bar


def score_record_attention(model, tokenizer, instances: Sequence, out: Path, *, batch_size: int = 8,
                           commit=lambda: None) -> list[dict]:
    """Each instance's records' per-token attention (``results.jsonl`` of ``out``, resuming); returns the
    records of ``instances``."""
    path = out / "results.jsonl"
    repair_jsonl(path)
    done = {r["id"] for r in read_jsonl(path, key="id")}
    todo = [i for i in instances if i.id not in done]
    bar = progress_bar(len(instances), initial=len(instances) - len(todo), desc="attention bias", unit="prompt")
    with AttentionProbe(model, record_means=True):
        for group in question_groups(todo, batch_size, shared=True):
            scored = score_instances(model, tokenizer, group, batch_size=batch_size)
            commit()
            for inst, r in zip(group, scored):
                append_jsonl(path, {"id": inst.id, "depth": inst.depth, "gold_index": inst.gold_index,
                                    "gold_items": inst.meta.get("gold_items", [inst.gold_index]), "em": r["em"],
                                    "record_means": r["attn_record_means"]})
            bar.update(len(group))
    bar.close()
    wanted = {i.id for i in instances}
    return [r for r in read_jsonl(path, key="id") if r["id"] in wanted]


def bias_by_slot(records: Sequence[dict]) -> tuple[list[float], list[int]]:
    """Per slot: the mean per-token attention of the non-gold records there, and how many were averaged."""
    slots = max(len(r["record_means"]) for r in records)
    values: list[list[float]] = [[] for _ in range(slots)]
    for r in records:
        for k, v in enumerate(r["record_means"]):
            if k not in r["gold_items"]:
                values[k].append(v)
    return [statistics.fmean(v) if v else 0.0 for v in values], [len(v) for v in values]


def write_bias(out: Path, records: Sequence[dict], settings: dict) -> dict:
    """``attention_bias.json`` and ``attention_bias.png`` from the scored records; returns the file's content."""
    bias, counts = bias_by_slot(records)
    doc = {"format": BIAS_FORMAT, "version": 1, **settings, "num_items": len(bias), "prompts": len(records),
           "bias": bias, "n": counts}
    atomic_write_json(out / "attention_bias.json", doc)
    fig, ax = pyplot().subplots(figsize=(7, 3.5))
    ax.plot([k / max(1, len(bias) - 1) for k in range(len(bias))], bias, lw=1)
    ax.set_xlabel("record slot (relative position in the prompt)")
    ax.set_ylabel("attention per token (non-gold records)")
    ax.set_title(f"positional attention bias: {settings.get('model')} / {settings.get('task')}, "
                 f"{len(records)} prompts", fontsize=9)
    ax.grid(alpha=0.3)
    save_figure(fig, out / "attention_bias.png")
    return doc
