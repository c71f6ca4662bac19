"""Teacher-forced answer scoring: one forward pass over prompt + gold answer.

Logits are computed only at the positions that predict answer tokens (``logits_to_keep``), so
scoring costs one prefill. Exact match (argmax equals the gold token at every answer position)
is identical to "greedy decoding reproduces the gold tokens" — see tests/test_teacher_forced.py.

A model marked :func:`prompt_dependent` (a method whose behaviour depends on where the prompt ends,
e.g. Ms-PoE's head order from the prompt's last token) is scored by prefilling the prompt alone and
feeding the answer through the cache (:func:`posbias.evaluation.scoring.score_via_cache`), so the
answer never reaches its prefill and teacher forcing sees what generation sees.
"""
from __future__ import annotations

from typing import Sequence

from tqdm.auto import tqdm

from posbias.evaluation.batching import encode, length_sorted_batches, model_max_positions, pad_id_of
from posbias.tasks.base import Instance


PROMPT_DEPENDENT_ATTR = "_posbias_prompt_dependent"


def prompt_dependent(model) -> bool:
    """True when ``model`` (or the model a wrapper scores with) must see each prompt prefilled alone."""
    return bool(getattr(model, PROMPT_DEPENDENT_ATTR, False))


def score_batch(model, batch, pad_id: int) -> list[dict]:
    """Score one batch of :class:`Encoded` instances; returns one dict per row (batch order)."""
    from posbias.evaluation.scoring import score_token_rows

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
    bar = tqdm(total=len(encoded), desc="teacher-forced", unit="inst", disable=not progress, leave=False)
    for batch in length_sorted_batches(encoded, batch_size):
        for r in score_batch(model, batch, pad_id):
            by_id[r["id"]] = r
        bar.update(len(batch))
    bar.close()
    return [by_id[inst.id] for inst in instances]
