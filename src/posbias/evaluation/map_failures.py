"""Why a map's answers are wrong: greedy generation on the questions teacher forcing got wrong, each
completion put in one class.

* ``correct``: teacher forcing reproduced the gold answer (nothing generated);
* ``worded``: the right answer worded differently (the gold value is in the completion, exact match missed);
* ``other_item``: the value of another item of the context (KV: another key's value; NIAH: another
  needle's), with its ``offset`` in items from the gold one (negative: an earlier item): position
  confusion rather than loss;
* ``not_in_context``: a value of the answer's shape that the context does not hold;
* ``format``: no value at all (the model wrote something else);
* ``wrong_answer``: a free-text answer the task's metric scores wrong (multi-document QA, whose answers have
  no shape to look for: ``worded`` there means the reference metric, best_subspan_em, finds an alias).
"""
from __future__ import annotations

import re
from collections import Counter, defaultdict
from typing import Sequence

import torch

from posbias.architecture.layers import cache_of, repeat_cache
from posbias.evaluation.batching import encode, eos_ids_of, model_max_positions, pad_id_of
from posbias.evaluation.generation import generation_budget, greedy_continue, greedy_generate
from posbias.evaluation.metrics import score
from posbias.evaluation.scoring import prefill, prompt_dependent

FAILURE_CLASSES = ("correct", "worded", "other_item", "not_in_context", "format", "wrong_answer")
FAILURE_NAMES = {"correct": "correct", "worded": "right answer, worded differently",
                 "other_item": "another item of the context", "not_in_context": "a value not in the context",
                 "format": "format failure (no value)", "wrong_answer": "a wrong free-text answer"}
UUID = r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"
# The context's items, in order, as (pattern, group holding the value) per task.
ITEM_PATTERNS = {"kv": (re.compile(r"^\S+: (\d+)$", re.M), 1),
                 "kv-uuid": (re.compile(rf'"{UUID}": "({UUID})"'), 1),
                 "niah": (re.compile(r"One of the special magic numbers for \S+ is: (\d+)\."), 1),
                 "passkey": (re.compile(r"The pass key is (\d+)\. Remember it\."), 1)}
VALUE_SHAPES = {"kv-uuid": re.compile(UUID)}
DIGITS = re.compile(r"\d+")


def context_values(task: str, prompt: str) -> list[str]:
    """The values of the context's items, in the order they appear in the prompt."""
    pattern, group = ITEM_PATTERNS[task]
    return [m.group(group) for m in pattern.finditer(prompt)]


def classify(task: str, prompt: str, gold: str, prediction: str) -> dict:
    """``{"failure": class, "offset": items from the gold one (other_item only), "retrieved": value}``."""
    values = context_values(task, prompt)
    shape = VALUE_SHAPES.get(task, DIGITS)
    found = shape.findall(prediction)
    if gold in prediction:
        return {"failure": "worded"}
    if not found:
        return {"failure": "format"}
    first = found[0]
    if first in values and gold in values:
        return {"failure": "other_item", "offset": values.index(first) - values.index(gold), "retrieved": first}
    return {"failure": "not_in_context", "retrieved": first}


def classify_group(model, tokenizer, group: Sequence, records: list[dict], cfg) -> None:
    """Add ``failure`` (and ``prediction`` / ``offset`` for the wrong ones) to ``records`` (one per
    instance of ``group``): greedy generation only on the questions teacher forcing got wrong, from
    one prefill of their shared context where they have one (:func:`generate_from_context`)."""
    wrong = [(inst, rec) for inst, rec in zip(group, records) if not rec["correct"]]
    for rec in records:
        if rec["correct"]:
            rec["failure"] = "correct"
    if not wrong:
        return
    insts = [i for i, _ in wrong]
    budget = generation_budget(tokenizer, insts, cfg.max_new_tokens)  # a UUID needs ~33 tokens, a number 16
    contexts = {i.meta.get("context_id") for i in insts}
    if None not in contexts and len(contexts) == 1 and not prompt_dependent(model):
        preds = generate_from_context(model, tokenizer, insts, max_new_tokens=budget, batch_size=cfg.batch_size)
    else:
        preds = greedy_generate(model, tokenizer, insts, max_new_tokens=budget, batch_size=cfg.batch_size)
    for (inst, rec), pred in zip(wrong, preds):
        task = inst.task if inst.task in ITEM_PATTERNS else cfg.task
        if task not in ITEM_PATTERNS:  # free-text answers (mdqa): the task's own metric decides
            right = score(inst.metric, pred, inst.answers) >= 1
            rec.update(prediction=pred, failure="worded" if right else "wrong_answer")
            continue
        rec.update(prediction=pred, **classify(task, inst.prompt, str(inst.answers[0]), pred))


@torch.no_grad()
def generate_from_context(model, tokenizer, instances: Sequence, *, max_new_tokens: int, batch_size: int) -> list[str]:
    """Greedy completions of questions that share one context (``meta["context_id"]``), the context
    prefilled once: its cache is repeated for up to ``batch_size`` questions, each question
    left-padded after it (pads masked, positions continuing from the context without gaps for the
    real tokens), then decoded greedily (:func:`posbias.evaluation.generation.greedy_continue`).
    The same completions as prefilling every ``context + question`` alone (same token ids)."""
    limit, pad_id = model_max_positions(model), pad_id_of(tokenizer)
    encoded = [encode(tokenizer, inst, False, limit) for inst in instances]
    context = encoded[0].prompt_ids[:encoded[0].context_len]
    last, cache, mask, next_pos = prefill(model, [context], pad_id)
    texts = []
    for start in range(0, len(encoded), batch_size):
        chunk = encoded[start:start + batch_size]
        questions = [e.prompt_ids[len(context):] for e in chunk]
        k, width = len(chunk), max(len(q) for q in questions)
        dev = mask.device
        ids = torch.full((k, width), pad_id, dtype=torch.long, device=dev)
        qmask = torch.zeros((k, width), dtype=torch.long, device=dev)
        pos = next_pos.expand(k, -1).repeat(1, width).clone()  # (k, width); pads keep the first position
        for b, q in enumerate(questions):
            ids[b, width - len(q):] = torch.tensor(q, dtype=torch.long, device=dev)
            qmask[b, width - len(q):] = 1
            pos[b, width - len(q):] += torch.arange(len(q), device=dev)
        full = torch.cat([mask.expand(k, -1), qmask], 1)
        rep = repeat_cache(cache, k)
        out = model(input_ids=ids, attention_mask=full, position_ids=pos, cache=rep, use_cache=True, logits_to_keep=1)
        after = next_pos.expand(k, -1) + torch.tensor([[len(q)] for q in questions], device=dev)
        new = greedy_continue(model, cache_of(out) or rep, full, after, out.logits[:, -1], eos_ids_of(tokenizer),
                              max_new_tokens)
        texts += [tokenizer.decode(t, skip_special_tokens=True) for t in new]
    return texts


def failure_summary(records: Sequence[dict], methods: Sequence[str]) -> dict:
    """``{method: {"counts": {class: n}, "by_length": {length: {class: n}}, "offsets": {offset: n}}}``."""
    out = {}
    for m in methods:
        rs = [r for r in records if r["method"] == m and "failure" in r]
        by_length: dict[int, Counter] = defaultdict(Counter)
        for r in rs:
            by_length[r["length"]][r["failure"]] += 1
        offsets = Counter(int(r["offset"]) for r in rs if r.get("offset") is not None)
        out[m] = {"counts": {c: sum(r["failure"] == c for r in rs) for c in FAILURE_CLASSES},
                  "by_length": {str(L): {c: cnt[c] for c in FAILURE_CLASSES} for L, cnt in sorted(by_length.items())},
                  "offsets": {str(k): v for k, v in sorted(offsets.items())}}
    return out


def failure_markdown(failures: dict) -> str:
    """The failure table of ``map.md``: per method the share of every class."""
    lines = ["## Failure decomposition (greedy generation on the wrong teacher-forced answers)", "",
             "| method | " + " | ".join(FAILURE_NAMES[c] for c in FAILURE_CLASSES) + " | most common offset |",
             "|---|" + "---:|" * (len(FAILURE_CLASSES) + 1)]
    for m, f in failures.items():
        total = max(1, sum(f["counts"].values()))
        common = max(f["offsets"].items(), key=lambda kv: kv[1])[0] if f["offsets"] else "-"
        lines.append(f"| {m} | " + " | ".join(f"{f['counts'][c]} ({100 * f['counts'][c] / total:.0f}%)"
                                              for c in FAILURE_CLASSES) + f" | {common} |")
    lines += ["", "offset: the retrieved item's index minus the gold item's (-1: the item just before the gold one)."]
    return "\n".join(lines)
