"""The same instance with its records shown in another order (attention sorting, order controls).

A task made of records (``meta["item_spans"]``: KV records, MDQA documents) is re-rendered by moving the
records' text between the separators that stood between them, so everything else in the prompt (instruction,
question, separators) stays byte for byte. A task whose records carry their position in their text (MDQA's
``Document [k]``) gives a ``relabel(text, position)`` so labels follow the order shown, as lost-in-the-middle
numbers them: a moved record never carries its old number. The instance keeps its id and ``depth`` (the
depth it was asked at); ``gold_index``, ``meta["item_spans"]`` and ``meta["gold_items"]`` follow the new order,
``meta["order"]`` says where each shown record came from, and a shared context's ids are dropped (the order is
the question's own).
"""
from __future__ import annotations

from dataclasses import replace
from typing import Callable, Sequence

from posbias.tasks.base import Instance

SHARED_KEYS = ("context_id", "context_chars")


def reordered(inst: Instance, order: Sequence[int], relabel: Callable[[str, int], str] | None = None) -> Instance:
    """``inst`` with record ``order[p]`` shown at position ``p`` (module docstring)."""
    spans = inst.meta.get("item_spans")
    if not spans:
        raise ValueError(f"instance {inst.id}: no records to reorder (task {inst.task!r} has no item_spans)")
    if sorted(order) != list(range(len(spans))):
        raise ValueError(f"instance {inst.id}: order must be a permutation of 0..{len(spans) - 1}")
    if any(e > s2 for (_, e), (s2, _) in zip(spans, spans[1:])):
        raise ValueError(f"instance {inst.id}: record spans overlap or are out of order")
    items = [inst.prompt[s:e] for s, e in spans]
    seps = [inst.prompt[e:s2] for (_, e), (s2, _) in zip(spans, spans[1:])]
    pieces, new_spans = [inst.prompt[:spans[0][0]]], []
    at = len(pieces[0])
    for pos, k in enumerate(order):
        item = relabel(items[k], pos) if relabel else items[k]
        new_spans.append([at, at + len(item)])
        pieces.append(item)
        at += len(item)
        if pos < len(seps):
            pieces.append(seps[pos])
            at += len(seps[pos])
    pieces.append(inst.prompt[spans[-1][1]:])
    where = {int(k): pos for pos, k in enumerate(order)}
    meta = {k: v for k, v in inst.meta.items() if k not in SHARED_KEYS}
    meta.update(item_spans=new_spans, order=[int(k) for k in order])
    if "gold_items" in inst.meta:
        meta["gold_items"] = sorted(where[g] for g in inst.meta["gold_items"])
    return replace(inst, prompt="".join(pieces), gold_index=where[inst.gold_index], meta=meta)
