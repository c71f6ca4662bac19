"""Teacher-forced scoring of continuations through a KV cache: one prefill, many answers.

Two uses of one mechanism:

* **prompt, then answer** (:func:`score_via_cache`): every prompt is prefilled alone and its gold
  answer is fed through the cache. A method whose behaviour depends on where the prompt ends
  (Ms-PoE orders its heads by the attention of the prompt's last token) then sees exactly what it
  sees under generation: the answer can never leak into the prefill.
* **one context, many questions** (:func:`score_shared_context`; instances grouped by context in
  :func:`posbias.evaluation.teacher_forced.score_instances`): the KV cache of a shared context
  (e.g. a KV list with N records) is computed once, under whatever method or scaling is active,
  repeated once per question, and every ``question + gold answer`` suffix runs against it in one
  batch. Exact match and log-probabilities equal those of scoring each ``context + question`` as its
  own prompt (same token ids; float tolerance), at the cost of one context prefill per context.

Continuations are **right-padded** after the cache: a row is ``[cache | suffix | pads]`` with
positions continuing from the cache without gaps, so the real tokens of a row stay contiguous (the
methods that rotate keys themselves place them relative to the last position); logits are kept from
the earliest position that predicts an answer token. The logits of the prefill's last position
predict the first suffix token (needed when the suffix *is* the answer).

Result records (one schema for every scorer): ``id``, ``em`` (argmax equals the gold token at every
answer position), ``logprob`` (sum of gold-token log-probabilities), ``n_tokens`` (answer length),
``prompt_tokens``, ``hits`` (1 / 0 per answer token: its argmax is the gold token), ``first_token``
(the argmax at the first answer position: the model's own first answer token). Teacher forcing
puts the gold tokens in context, so ``all(hits[g:])`` is the exact match with the first ``g`` answer
tokens given in the prompt (same tokens, same positions): one pass scores both.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from posbias.architecture.layers import cache_of, model_device, repeat_cache
from posbias.evaluation.batching import left_pad
from posbias.methods.forward_rows import forward_rows
from posbias.methods.registry import prompt_dependent


@dataclass
class Continuation:
    """One scored suffix: ``suffix_ids`` (S,) = question tokens + the ``n_answer`` gold answer tokens."""

    id: str
    suffix_ids: list[int]
    n_answer: int
    prompt_tokens: int
    spans: list[tuple[int, int]] | None = None  # the records' token spans in the prompt (context + question)


@torch.no_grad()
def prefill(model, rows: Sequence[Sequence[int]], pad_id: int):
    """Left-padded prefill with a cache; returns ``(last_logits (B, V), cache, mask (B, T), next_pos (B, 1))``."""
    ids, mask, pos = left_pad(rows, pad_id)
    dev = model_device(model)
    ids, mask, pos = ids.to(dev), mask.to(dev), pos.to(dev)
    out = model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True, logits_to_keep=1)
    return out.logits[:, -1], cache_of(out), mask, pos[:, -1:] + 1


@torch.no_grad()
def score_continuations(model, cache, mask: torch.Tensor, next_pos: torch.Tensor, last_logits: torch.Tensor,
                        items: Sequence[Continuation], pad_id: int) -> list[dict]:
    """Score ``items[b]`` against row ``b`` of ``cache`` (B rows; see the module docstring).

    Suffixes are right-padded and their positions continue from the cache without gaps (pads
    included), so the real tokens of every row are contiguous, as methods that place keys
    relative to the last position assume; no real token attends to a pad (causal).
    """
    dev = mask.device
    width = max(len(c.suffix_ids) for c in items)
    ids = torch.full((len(items), width), pad_id, dtype=torch.long, device=dev)
    smask = torch.zeros((len(items), width), dtype=torch.long, device=dev)
    for b, c in enumerate(items):
        ids[b, :len(c.suffix_ids)] = torch.tensor(c.suffix_ids, dtype=torch.long, device=dev)
        smask[b, :len(c.suffix_ids)] = 1
    pos = next_pos + torch.arange(width, device=dev)[None]
    questions = [len(c.suffix_ids) - c.n_answer for c in items]
    first = max(0, min(questions) - 1)  # earliest suffix position whose logits predict an answer token
    pads = (mask == 0).sum(1).tolist()
    # each row's prompt's last token: among the suffix's queries after its question, or (no question: the
    # suffix is the answer) in the prefill before (-1)
    with forward_rows(model, [c.id for c in items], [q - 1 for q in questions], pads,
                      [mask.shape[1] - p + q for p, q in zip(pads, questions)], mask.shape[1] + width,
                      [c.spans for c in items]):
        out = model(input_ids=ids, attention_mask=torch.cat([mask, smask], 1), position_ids=pos, cache=cache,
                    use_cache=True, logits_to_keep=width - first)
    logits = out.logits  # (B, width - first, V): suffix positions first .. width - 1
    results = []
    for b, (c, q) in enumerate(zip(items, questions)):
        # answer token j (suffix index q + j) is predicted by suffix index q + j - 1 (the prefill for -1)
        if q == 0:
            pred = torch.cat([last_logits[b: b + 1], logits[b, : c.n_answer - 1]])
        else:
            pred = logits[b, q - 1 - first: q - 1 - first + c.n_answer]
        results.append(answer_record(c.id, pred, c.suffix_ids[q:], c.prompt_tokens))
    return results


def answer_record(id_: str, logits: torch.Tensor, gold_ids: Sequence[int], prompt_tokens: int) -> dict:
    """The record of one answer (module docstring) from its logits ``[A, V]`` (row ``a`` predicts
    ``gold_ids[a]``)."""
    logp = torch.log_softmax(logits.float(), dim=-1)  # (A, V)
    gold = torch.tensor(list(gold_ids), device=logp.device)
    predicted = logp.argmax(-1)
    hits = predicted == gold
    return {"id": id_, "em": bool(hits.all()), "logprob": float(logp.gather(-1, gold[:, None]).sum()),
            "n_tokens": len(gold_ids), "prompt_tokens": prompt_tokens, "hits": [int(h) for h in hits.tolist()],
            "first_token": int(predicted[0]) if len(gold_ids) else None}


@torch.no_grad()
def score_token_rows(model, prompts: Sequence[Sequence[int]], answers: Sequence[Sequence[int]], pad_id: int,
                     ids: Sequence[str] | None = None, spans: Sequence | None = None) -> list[dict]:
    """Teacher-forced scores of ``answers[b]`` after ``prompts[b]`` in one left-padded forward pass
    (logits only at the answer positions); a :func:`prompt_dependent` model is scored through the
    cache instead (:func:`score_via_cache`). Records as in the module docstring (``id`` = ``ids[b]``
    or the row index). ``spans``: each prompt's records (token spans), for record-aware methods."""
    ids = [str(b) for b in range(len(prompts))] if ids is None else list(ids)
    if prompt_dependent(model):
        return score_rows_via_cache(model, prompts, answers, pad_id, ids, spans)
    tokens, mask, pos = left_pad([list(p) + list(a) for p, a in zip(prompts, answers)], pad_id)
    dev = model_device(model)
    keep = max(len(a) for a in answers) + 1
    width = tokens.shape[1]
    starts = [width - len(p) - len(a) for p, a in zip(prompts, answers)]  # each row's prompt, left-padded
    with forward_rows(model, ids, [width - len(a) - 1 for a in answers], starts, [len(p) for p in prompts], width,
                      spans):
        out = model(input_ids=tokens.to(dev), attention_mask=mask.to(dev), position_ids=pos.to(dev),
                    logits_to_keep=keep, use_cache=False)
    results = []
    for b, (i, p, a) in enumerate(zip(ids, prompts, answers)):
        results.append(answer_record(i, out.logits[b, keep - 1 - len(a): keep - 1], a, len(p)))
    return results


def score_rows_via_cache(model, prompts, answers, pad_id: int, ids: Sequence[str], spans: Sequence | None = None
                         ) -> list[dict]:
    """Teacher-forced scores with each prompt prefilled alone, then its answer fed through the cache."""
    spans = list(spans) if spans is not None else [None] * len(prompts)
    last, cache, mask, next_pos = prefill_rows(model, prompts, pad_id, ids, spans)
    items = [Continuation(i, list(a), len(a), len(p), sp) for i, p, a, sp in zip(ids, prompts, answers, spans)]
    return score_continuations(model, cache, mask, next_pos, last, items, pad_id)


def prefill_rows(model, prompts, pad_id: int, ids: Sequence[str], spans: Sequence | None = None):
    """:func:`prefill` of whole prompts, described as rows that end with their prompt's last token
    (:mod:`posbias.methods.forward_rows`: what record-aware methods and the attention diagnostic read)."""
    width = max(len(p) for p in prompts)
    with forward_rows(model, ids, [width - 1] * len(prompts), [width - len(p) for p in prompts],
                      [len(p) for p in prompts], width, spans):
        return prefill(model, prompts, pad_id)


def score_via_cache(model, batch, pad_id: int) -> list[dict]:
    """:func:`score_rows_via_cache` of :class:`~posbias.evaluation.batching.Encoded` rows."""
    return score_rows_via_cache(model, [e.prompt_ids for e in batch], [e.answer_ids for e in batch], pad_id,
                                [e.inst.id for e in batch], [e.item_spans for e in batch])


def score_shared_context(model, context_ids: Sequence[int], items: Sequence[Continuation], pad_id: int,
                         batch_size: int = 16) -> list[dict]:
    """Score every ``context + item.suffix`` from one prefill of ``context_ids``.

    The context cache is computed once and repeated for up to ``batch_size`` questions at a time
    (a fresh repeat per batch, so no batch sees another's tokens).
    """
    if not items:
        return []
    last, cache, mask, next_pos = prefill(model, [list(context_ids)], pad_id)
    results = []
    for start in range(0, len(items), batch_size):
        chunk = list(items[start:start + batch_size])
        rep = repeat_cache(cache, len(chunk))
        k = len(chunk)
        results += score_continuations(model, rep, mask.expand(k, -1), next_pos.expand(k, -1),
                                       last.expand(k, -1), chunk, pad_id)
    return results
