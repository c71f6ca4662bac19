"""Greedy generation with a KV cache, batched with left padding (a manual loop, so any wrapper
with the Hugging Face causal-LM call signature works, not only ``PreTrainedModel.generate``)."""
from __future__ import annotations

import contextlib
from typing import Sequence

import torch

from posbias.architecture.layers import cache_of, repeat_cache
from posbias.evaluation.batching import encode, eos_ids_of, length_sorted_batches, model_max_positions, pad_id_of
from posbias.evaluation.scoring import Continuation, prefill, prefill_rows, score_continuations
from posbias.evaluation.teacher_forced import accept_alternatives, teacher_forced_fields
from posbias.methods.forward_rows import forward_rows
from posbias.tasks.base import Instance
from posbias.utils.progress import progress_bar

ANSWER_SLACK = 4  # tokens generated beyond the longest gold answer (a quote, punctuation, a space)
GENERATION_FLOOR = 16  # posbias eval's fixed limit before it followed the answers: short answers keep it


def answer_tokens(tokenizer, inst: Instance) -> int:
    """Tokens of the instance's gold answers written as one string after a space (`` a, b``)."""
    text = ", ".join(str(a) for a in inst.answers)
    return len(tokenizer(" " + text, add_special_tokens=False)["input_ids"])


def generation_budget(tokenizer, instances: Sequence[Instance], max_new_tokens: int | None = None, *,
                      floor: int = GENERATION_FLOOR) -> int:
    """``max_new_tokens``, or when it is None enough to write every gold answer in full: the longest
    answer's tokens + :data:`ANSWER_SLACK` (a 36-character UUID is ~33 tokens in Gemma's vocabulary),
    and at least ``floor`` (room for a few words before a short answer)."""
    if max_new_tokens is not None:
        return int(max_new_tokens)
    longest = max((answer_tokens(tokenizer, inst) for inst in instances), default=0)
    return max(floor, longest + ANSWER_SLACK)


@torch.no_grad()
def greedy_batch(model, prompts: list[list[int]], pad_id: int, eos_ids: set[int], max_new_tokens: int,
                 stop=None, ids: Sequence[str] | None = None, spans: Sequence | None = None) -> list[list[int]]:
    """Greedy-decode up to ``max_new_tokens`` for each prompt; returns the new token ids per row.

    A row ends at an EOS token or when ``stop(row_tokens)`` returns True (e.g. a stop string). With ``ids``
    (and the records' ``spans``) the prefill and every decoding step are described to record-aware methods
    (:mod:`posbias.methods.forward_rows`: the prompt's last token and each decoded token are answer rows).
    """
    if ids is None:
        last, cache, mask, next_pos = prefill(model, prompts, pad_id)
        return greedy_continue(model, cache, mask, next_pos, last, eos_ids, max_new_tokens, stop=stop)
    last, cache, mask, next_pos = prefill_rows(model, prompts, pad_id, ids, spans)
    width = max(len(p) for p in prompts)
    rows = (list(ids), [width - len(p) for p in prompts], [len(p) for p in prompts], spans)
    return greedy_continue(model, cache, mask, next_pos, last, eos_ids, max_new_tokens, stop=stop, rows=rows)


@torch.no_grad()
def greedy_continue(model, cache, mask: torch.Tensor, next_pos: torch.Tensor, last_logits: torch.Tensor,
                    eos_ids: set[int], max_new_tokens: int, stop=None, rows: tuple | None = None) -> list[list[int]]:
    """Greedy decoding from a prefill (:func:`posbias.evaluation.scoring.prefill`): ``last_logits``
    (B, V) of its last position, its ``cache``, ``mask`` (B, T) and ``next_pos`` (B, 1). ``rows``: ``(ids,
    prompt starts, prompt lengths, spans)`` to describe each step to record-aware methods (every decoded
    token is an answer row)."""
    generated: list[list[int]] = [[] for _ in range(last_logits.shape[0])]
    done = torch.zeros(len(generated), dtype=torch.bool)
    logits = last_logits
    for _ in range(max_new_tokens):
        nxt = logits.argmax(-1)  # (B,)
        for b, t in enumerate(nxt.tolist()):
            if not done[b]:
                if t in eos_ids:
                    done[b] = True
                else:
                    generated[b].append(t)
                    done[b] = bool(stop is not None and stop(generated[b]))
        if bool(done.all()):
            break
        mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
        described = forward_rows(model, rows[0], [-1] * len(rows[0]), rows[1], rows[2], mask.shape[1], rows[3]) \
            if rows is not None else contextlib.nullcontext()
        with described:
            out = model(input_ids=nxt[:, None], attention_mask=mask, position_ids=next_pos,
                        cache=cache, use_cache=True, logits_to_keep=1)
        cache = cache_of(out) or cache
        logits = out.logits[:, -1]
        next_pos = next_pos + 1
    return generated


def greedy_generate(model, tokenizer, instances: Sequence[Instance], *, max_new_tokens: int | None = None,
                    batch_size: int = 8, chat: bool = False, progress: bool = False) -> list[str]:
    """Greedy completions (decoded text) in the order of ``instances``, each at most ``max_new_tokens``
    tokens (None: :func:`generation_budget` of the instances)."""
    max_new_tokens = generation_budget(tokenizer, instances, max_new_tokens)
    limit = model_max_positions(model)
    encoded = [encode(tokenizer, inst, chat, limit) for inst in instances]
    if limit:
        for e in encoded:
            if len(e.prompt_ids) + max_new_tokens > limit:
                raise ValueError(f"instance {e.inst.id}: prompt + {max_new_tokens} new tokens exceeds {limit} "
                                 "positions")
    pad_id = pad_id_of(tokenizer)
    eos_ids = eos_ids_of(tokenizer)
    texts: dict[str, str] = {}
    bar = progress_bar(len(encoded), desc="generate", unit="inst", enabled=progress, leave=False)
    for batch in length_sorted_batches(encoded, batch_size):
        new = greedy_batch(model, [e.prompt_ids for e in batch], pad_id, eos_ids, max_new_tokens,
                           ids=[e.inst.id for e in batch], spans=[e.item_spans for e in batch])
        for e, toks in zip(batch, new):
            texts[e.inst.id] = tokenizer.decode(toks, skip_special_tokens=True)
        bar.update(len(batch))
    bar.close()
    return [texts[inst.id] for inst in instances]


def score_shared_prefill(model, tokenizer, inst, *, chat: bool, max_new_tokens: int) -> dict | None:
    """:func:`score_and_generate` of one instance."""
    both = score_and_generate(model, tokenizer, [inst], chat=chat, max_new_tokens=max_new_tokens)
    return None if both is None else both[0]


def score_and_generate(model, tokenizer, instances: Sequence[Instance], *, chat: bool, max_new_tokens: int
                       ) -> list[dict] | None:
    """Teacher-forced score *and* greedy completion of each instance from one prefill of the batch.

    At long lengths the prefill is nearly all the cost, so this halves the run time against
    ``score_teacher_forced`` + ``greedy_generate`` (two prefills). The prompts are prefilled once, left-padded,
    with a KV cache (``logits_to_keep=1``); the gold answer tokens are then fed through a copy of that cache
    (teacher forcing: the argmax at every answer position must equal the gold token, as in
    :func:`posbias.evaluation.teacher_forced.score_batch`), and greedy decoding continues from the prefill's own
    cache and logits (stopping at EOS, as :func:`greedy_batch`; a copy rather than cropping the cache back: a
    sliding-window layer cannot be cropped once its window is full). Same tokenisation (``encode``) as the
    lead scorers; an unmatched target is retried on the task's other accepted forms
    (:func:`~posbias.evaluation.teacher_forced.accept_alternatives`, one more prefill each). Returns one
    record per instance (``tf_*`` fields and ``prediction``), or ``None`` for a cache that cannot be copied
    layer by layer (the caller then falls back to the two-pass scorers).
    """
    encoded = [encode(tokenizer, inst, chat, model_max_positions(model)) for inst in instances]
    prompts, ids = [list(e.prompt_ids) for e in encoded], [e.inst.id for e in encoded]
    spans = [e.item_spans for e in encoded]
    pad_id = pad_id_of(tokenizer)
    last, cache, mask, next_pos = prefill_rows(model, prompts, pad_id, ids, spans)
    if cache is None or not hasattr(cache, "layers"):
        return None
    answers = [Continuation(e.inst.id, list(e.answer_ids), len(e.answer_ids), len(e.prompt_ids), e.item_spans)
               for e in encoded]  # teacher-forced through a copy of the cache
    tf = score_continuations(model, repeat_cache(cache, 1), mask, next_pos, last, answers, pad_id)
    width = max(len(p) for p in prompts)
    generated = greedy_continue(model, cache, mask, next_pos, last, eos_ids_of(tokenizer), max_new_tokens,
                                rows=(ids, [width - len(p) for p in prompts], [len(p) for p in prompts], spans))
    tf = accept_alternatives(model, tokenizer, instances, tf, batch_size=len(instances), chat=chat)
    return [{**teacher_forced_fields({**r, "n_tokens": len(e.answer_ids), "prompt_tokens": len(e.prompt_ids)}),
             "prediction": tokenizer.decode(g, skip_special_tokens=True)} for r, e, g in zip(tf, encoded, generated)]
