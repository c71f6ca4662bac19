"""Teacher-forced answer scoring: one forward pass over prompt + gold answer.

Logits are computed only at the positions that predict answer tokens (``logits_to_keep``), so
scoring costs one prefill. Exact match (argmax equals the gold token at every answer position)
is identical to "greedy decoding reproduces the gold tokens" — see tests/evaluation/test_teacher_forced.py.

A model marked :func:`prompt_dependent` (a method whose behaviour depends on where the prompt ends,
e.g. Ms-PoE's head order from the prompt's last token) is scored by prefilling the prompt alone and
feeding the answer through the cache (:func:`posbias.evaluation.scoring.score_via_cache`), so the
answer never reaches its prefill and teacher forcing sees what generation sees.
"""
from __future__ import annotations

from collections import defaultdict
from typing import Sequence

from posbias.evaluation.batching import encode, length_sorted_batches, model_max_positions, pad_id_of
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
                            ids=[e.inst.id for e in batch])


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
    return [by_id[inst.id] for inst in instances]


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
    limit, pad_id = (model_max_positions(model), pad_id_of(tokenizer)) if groups else (0, 0)
    for cid, members in groups.items():
        encoded = [encode(tokenizer, inst, False, limit) for inst in members]
        context = encoded[0].prompt_ids[:encoded[0].context_len]
        if any(e.prompt_ids[:e.context_len] != context for e in encoded):
            raise ValueError(f"instances of shared context {cid!r} do not start with the same context tokens")
        items = [Continuation(e.inst.id, e.prompt_ids[len(context):] + e.answer_ids, len(e.answer_ids),
                              len(e.prompt_ids)) for e in encoded]
        # questions are short: up to 16 of them share one batch whatever the prompt batch size
        for r in score_shared_context(model, context, items, pad_id, batch_size=max(batch_size, 16)):
            by_id[r["id"]] = r
    return [by_id[inst.id] for inst in instances]
