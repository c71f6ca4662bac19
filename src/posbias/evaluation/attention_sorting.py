"""Attention sorting (Peysakhovich and Lerer 2023, "Attention sorting combats recency bias in long context
language models"): read the prompt once, see which records the answer position attends to, show the records
again sorted by that attention, repeat; then answer.

One round here: a teacher-forced forward of each question's own prompt with the attention probe
(:mod:`posbias.evaluation.attention_probe`) takes the last prompt position's attention over every record (the
per-token mean over the record, averaged over layers and heads: the document attention of Hsieh et al. 2024,
so a long record does not win by its length); the records are then re-shown in ascending order of it
(``most_attended="last"``: the most attended record next to the question, the paper's order) or descending
(``"first"``). The task's labels follow the order shown (:mod:`posbias.tasks.reorder`). Each round costs one
prefill of every prompt, and a shared context's questions become prompts of their own (each question sorts
the records its own way). Records are scored at the depth they were asked at; their ``gold_index`` is where
the gold was shown in the end, ``original_gold_index`` where it was asked.
"""
from __future__ import annotations

from typing import Sequence

from posbias.evaluation.attention_probe import AttentionProbe, probe_of
from posbias.evaluation.teacher_forced import score_instances
from posbias.methods.attention_sorting import ORDERS
from posbias.tasks.base import Instance
from posbias.tasks.registry import reordered_instance


def sorting_order(means: Sequence[float], most_attended: str = "last") -> list[int]:
    """Record indices in the order to show them: ascending attention (``"last"``) or descending (``"first"``);
    ties keep the current order."""
    if most_attended not in ORDERS:
        raise ValueError(f"most_attended must be one of {', '.join(ORDERS)}, got {most_attended!r}")
    sign = 1.0 if most_attended == "last" else -1.0
    return sorted(range(len(means)), key=lambda k: sign * means[k])


def record_attention(model, tokenizer, instances: Sequence[Instance], *, chat: bool, batch_size: int
                     ) -> list[list[float]]:
    """Per instance, the last prompt position's attention per record (per-token mean, layer and head
    averaged), from a teacher-forced forward of each prompt; an active probe (``--attention``) is used as is."""
    probe = probe_of(model)
    own = probe is None
    probe = AttentionProbe(model) if own else probe
    saved, probe.record_means = probe.record_means, True
    try:
        rows = score_instances(model, tokenizer, instances, batch_size=batch_size, chat=chat, shared=False)
    finally:
        probe.record_means = saved
        if own:
            probe.remove()
    return [r["attn_record_means"] for r in rows]


def attention_sorted(model, tokenizer, instances: Sequence[Instance], *, chat: bool = False, batch_size: int = 8,
                     rounds: int = 1, most_attended: str = "last") -> list[Instance]:
    """``instances`` with their records re-shown in attention order, ``rounds`` times (module docstring)."""
    shown = list(instances)
    for _ in range(rounds):
        means = record_attention(model, tokenizer, shown, chat=chat, batch_size=batch_size)
        shown = [compose(inst, sorting_order(m, most_attended)) for inst, m in zip(shown, means)]
    return shown


def compose(inst: Instance, order: list[int]) -> Instance:
    """``inst`` reordered by ``order`` (relative to its current order), ``meta["order"]`` relative to the order
    it was asked in."""
    before = inst.meta.get("order", list(range(len(order))))
    out = reordered_instance(inst, order)
    out.meta["order"] = [before[k] for k in order]
    out.meta.setdefault("original_gold_index", inst.meta.get("original_gold_index", inst.gold_index))
    return out
