"""Teacher-forced answer scoring: one forward pass over prompt + gold answer.

Logits are computed only at the positions that predict answer tokens (``logits_to_keep``), so
scoring costs one prefill. Exact match (argmax equals the gold token at every answer position)
is identical to "greedy decoding reproduces the gold tokens" — see tests/evaluation/test_teacher_forced.py.

A model marked :func:`prompt_dependent` (a method whose behaviour depends on where the prompt ends,
e.g. Ms-PoE's head order from the prompt's last token) is scored by prefilling the prompt alone and
feeding the answer through the cache (:func:`posbias.evaluation.scoring.score_via_cache`), so the
answer never reaches its prefill and teacher forcing sees what generation sees.

A task may accept other surface forms of its answer (``meta["tf_alternatives"]``: continuations of the
prompt taken verbatim, e.g. RULER's needles read "... is: 3183136." and a model may answer the prefix
"... mentioned in the provided text is" with ": 3183136" instead of " 3183136"). An instance whose
target is not matched is scored again on each alternative that starts with the model's own first answer
token (:func:`accept_alternatives`); ``em`` counts a matched alternative (named in ``em_form``), while
``logprob``, ``hits`` and ``n_tokens`` stay those of the first target, so log-prob objectives and
tables do not change with the form.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import replace
from functools import partial
from typing import Sequence

from posbias.evaluation.attention_probe import gold_attention, probe_of, record_means
from posbias.evaluation.batching import encode, item_token_spans, length_sorted_batches, model_max_positions, pad_id_of
from posbias.evaluation.scoring import (  # noqa: F401
    Continuation,
    prompt_dependent,
    score_shared_context,
    score_token_rows,
)
from posbias.tasks.base import Instance
from posbias.utils.progress import progress_bar


def score_batch(model, batch, pad_id: int) -> list[dict]:
    """Score one batch of :class:`Encoded` instances; returns one dict per row (batch order)."""
    return score_token_rows(model, [e.prompt_ids for e in batch], [e.answer_ids for e in batch], pad_id,
                            ids=[e.inst.id for e in batch], spans=[e.item_spans for e in batch])


def score_teacher_forced(model, tokenizer, instances: Sequence[Instance], *, batch_size: int = 8,
                         chat: bool = False, progress: bool = False) -> list[dict]:
    """Teacher-forced scores, in the order of ``instances``.

    Args:
        model: any callable with the Hugging Face causal-LM signature (``input_ids``,
            ``attention_mask``, ``position_ids``, ``logits_to_keep``) returning ``.logits``.
    Returns:
        one dict per instance: ``id``, ``em`` (bool), ``logprob`` (sum of gold-token log-probs),
        ``n_tokens`` (answer length), ``prompt_tokens``.
    """
    limit = model_max_positions(model)
    encoded = [encode(tokenizer, inst, chat, limit) for inst in instances]
    pad_id = pad_id_of(tokenizer)
    by_id: dict[str, dict] = {}
    bar = progress_bar(len(encoded), desc="teacher-forced", unit="inst", enabled=progress, leave=False)
    for batch in length_sorted_batches(encoded, batch_size):
        for r in score_batch(model, batch, pad_id):
            by_id[r["id"]] = r
        bar.update(len(batch))
    bar.close()
    return accept_alternatives(model, tokenizer, instances, [by_id[inst.id] for inst in instances],
                               batch_size=batch_size, chat=chat)


def alternative_instances(inst: Instance) -> list[Instance]:
    """``inst`` once per accepted other form of its answer (``meta["tf_alternatives"]``), each the
    teacher-forced target taken verbatim after the prompt (ids ``<id>#alt<k>``)."""
    meta = {k: v for k, v in inst.meta.items() if k != "tf_alternatives"}
    return [replace(inst, id=f"{inst.id}#alt{k}", meta={**meta, "tf_target": text, "answer_joined": True})
            for k, text in enumerate(inst.meta.get("tf_alternatives", ()))]


def first_token_of(tokenizer, text: str) -> int | None:
    """The first token of an answer taken verbatim (as :func:`~posbias.evaluation.batching.encode`
    tokenises a joined answer: alone, without special tokens)."""
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    return ids[0] if ids else None


def accept_alternatives(model, tokenizer, instances: Sequence[Instance], records: list[dict], *, batch_size: int,
                        chat: bool, scorer=None) -> list[dict]:
    """``records`` (one per instance, as the scorers return them) with ``em`` set where the first target
    failed and one of the instance's alternative forms is matched (``em_form``: that form's text).
    ``scorer(instances) -> records`` scores the alternatives (default: :func:`score_teacher_forced`).
    A form is scored only when its first token is the model's own first answer token (``first_token``
    of the record; the prompt is the same, so any other form cannot be matched): a model that fails
    the task costs no second pass."""
    retry = [(inst.id, alt) for inst, r in zip(instances, records) if not r["em"]
             for alt in alternative_instances(inst)
             if first_token_of(tokenizer, alt.meta["tf_target"]) == r.get("first_token")]
    if not retry:
        return records
    scorer = scorer or partial(score_teacher_forced, model, tokenizer, batch_size=batch_size, chat=chat)
    matched = {}
    for (inst_id, alt), r in zip(retry, scorer([alt for _, alt in retry])):
        if r["em"]:
            matched.setdefault(inst_id, alt.meta["tf_target"])
    return [{**r, "em": True, "em_form": matched[inst.id]} if inst.id in matched else r
            for inst, r in zip(instances, records)]


def teacher_forced_fields(record: dict) -> dict:
    """A scorer's record as the fields of an eval / grid record: ``tf_em``, ``tf_logprob``, ``n_tokens``,
    ``tf_hits`` (1 / 0 per answer token), ``prompt_tokens`` where known, and ``tf_em_form`` where another
    form the task accepts was matched (:func:`accept_alternatives`)."""
    out = {"tf_em": bool(record["em"]), "tf_logprob": float(record["logprob"]), "n_tokens": int(record["n_tokens"]),
           "tf_hits": record["hits"]}
    if "prompt_tokens" in record:
        out["prompt_tokens"] = int(record["prompt_tokens"])
    if "em_form" in record:
        out["tf_em_form"] = record["em_form"]
    out.update({k: v for k, v in record.items() if k.startswith("attn_")})  # the attention diagnostic
    return out


def score_instances(model, tokenizer, instances, *, batch_size: int = 8, chat: bool = False, shared: bool = True,
                    progress: bool = False) -> list[dict]:
    """Teacher-forced scores of ``instances``, in their order: the questions of each shared context
    (``meta["context_id"]``) from one prefill of that context, everything else (and everything when
    ``shared`` is False, under a chat template, or for a :func:`prompt_dependent` model) one prompt
    per question (:func:`posbias.evaluation.teacher_forced.score_teacher_forced`)."""

    groups: dict[str, list] = defaultdict(list)
    singles = []
    for inst in instances:
        cid = inst.meta.get("context_id") if shared and not chat and not prompt_dependent(model) else None
        (groups[cid] if cid is not None else singles).append(inst)
    by_id = {r["id"]: r for r in score_teacher_forced(model, tokenizer, singles, batch_size=batch_size, chat=chat)} \
        if singles else {}
    for cid, members in groups.items():
        one_prefill = partial(score_context_questions, model, tokenizer, cid, batch_size=batch_size)
        for r in accept_alternatives(model, tokenizer, members, one_prefill(members), batch_size=batch_size,
                                     chat=False, scorer=one_prefill):
            by_id[r["id"]] = r
    return with_attention(model, tokenizer, instances, [by_id[inst.id] for inst in instances], chat)


def with_attention(model, tokenizer, instances: Sequence[Instance], records: list[dict], chat: bool) -> list[dict]:
    """``records`` with the attention diagnostic's fields (``attn_*``, :func:`~posbias.evaluation.attention_probe.
    gold_attention`) when an :class:`~posbias.evaluation.attention_probe.AttentionProbe` is active on
    ``model``; the probe's captures are cleared."""
    probe = probe_of(model)
    if probe is None:
        return records
    out = []
    for inst, r in zip(instances, records):
        att = probe.pop(inst.id)
        if att is None:
            raise RuntimeError(f"the attention diagnostic captured nothing for instance {inst.id}")
        gold = inst.meta.get("gold_items", [inst.gold_index])
        spans = item_token_spans(tokenizer, inst, chat)
        extra = {"attn_record_means": record_means(att, spans)} if probe.record_means else {}
        out.append({**r, **gold_attention(att, spans, gold), **extra})
    probe.clear()
    return out


def question_groups(instances: Sequence[Instance], batch_size: int, shared: bool) -> list[list[Instance]]:
    """Instances in scoring units: every question of one shared context together (one prefill), the
    rest in batches of ``batch_size``, in the order their first member comes in ``instances``."""
    groups: dict[str, list] = {}
    singles = []
    for inst in instances:
        cid = inst.meta.get("context_id") if shared else None
        (groups.setdefault(cid, []) if cid is not None else singles).append(inst)
    return list(groups.values()) + [singles[i:i + batch_size] for i in range(0, len(singles), batch_size)]


def score_context_questions(model, tokenizer, cid: str, questions: Sequence[Instance], batch_size: int) -> list[dict]:
    """Teacher-forced scores of the questions of shared context ``cid``, in their order, from one prefill
    of the context (:func:`posbias.evaluation.scoring.score_shared_context`)."""
    encoded = [encode(tokenizer, inst, False, model_max_positions(model)) for inst in questions]
    context = encoded[0].prompt_ids[:encoded[0].context_len]
    if any(e.prompt_ids[:e.context_len] != context for e in encoded):
        raise ValueError(f"instances of shared context {cid!r} do not start with the same context tokens")
    items = [Continuation(e.inst.id, e.prompt_ids[len(context):] + e.answer_ids, len(e.answer_ids),
                          len(e.prompt_ids), e.item_spans) for e in encoded]
    # questions are short: up to 16 of them share one batch whatever the prompt batch size
    return score_shared_context(model, context, items, pad_id_of(tokenizer), batch_size=max(batch_size, 16))
