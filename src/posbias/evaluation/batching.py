"""Turn instances into token ids and left-padded batches.

Left padding puts every row's last token at the same index, so one ``logits_to_keep`` covers the
answer positions of all rows; explicit ``position_ids`` (``cumsum(mask) - 1``) keep RoPE
positions identical to the unpadded sequence.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, Sequence

import torch

from posbias.tasks.base import Instance
from posbias.tasks.chat import apply_chat, plain_prompt


class ContextTooLongError(ValueError):
    """An input longer than the model can hold."""


def prompt_text(tokenizer, inst: Instance, chat: bool) -> str:
    """The text the model sees before its answer (chat template applied when ``chat``)."""

    if chat:
        return apply_chat(tokenizer, inst.prompt, inst.answer_prefix)
    return plain_prompt(inst.prompt, inst.answer_prefix)


def answer_text(prompt: str, answer: str, joined: bool = False) -> str:
    """The gold continuation: a space is prepended unless the prompt already ends in whitespace or the
    answer continues the prompt's last word (``joined``: the passkey digits after the given ones)."""
    return answer if (joined or not prompt or prompt[-1].isspace()) else " " + answer


@dataclass
class Encoded:
    """Token ids of one instance: ``prompt_ids`` (P,) and ``answer_ids`` (A,); the first
    ``context_len`` prompt ids are a context shared with other instances (0: none); ``item_spans``: the token
    spans ``[(start, end), ...]`` of the task's records in ``prompt_ids`` (None for a task without records or
    a tokenizer without character offsets)."""

    inst: Instance
    prompt_ids: list[int]
    answer_ids: list[int]
    context_len: int = 0
    item_spans: list[tuple[int, int]] | None = None


def encode(tokenizer, inst: Instance, chat: bool, max_positions: int = 0) -> Encoded:
    """Tokenise prompt and gold answer separately (so the answer tokens are exactly known).

    The teacher-forced target is ``inst.meta["tf_target"]`` when the task sets one (the answer as the
    prompt's format writes it, e.g. a JSON value with its opening quote), else ``inst.answers[0]``.

    An instance of a shared context (``meta["context_chars"]``, see ``shared_context`` in the task
    generators) is tokenised as context + rest, so every question of one context starts with the
    same context ids whichever scorer runs it. The records' token spans come from the same tokenisation's
    character offsets (the tokens whose characters overlap each record's, ``meta["item_spans"]``).
    """
    text = prompt_text(tokenizer, inst, chat)
    cut = inst.meta.get("context_chars")
    if cut is not None and chat:
        raise ValueError(f"instance {inst.id} belongs to a shared context, which is scored without a chat template")
    pieces = [(0, len(text), not chat)] if cut is None else [(0, cut, True), (cut, len(text), False)]
    offsets = getattr(tokenizer, "is_fast", False) and bool(inst.meta.get("item_spans"))
    prompt_ids, starts, ends, lengths = [], [], [], []
    for lo, hi, special in pieces:
        enc = tokenizer(text[lo:hi], add_special_tokens=special, return_offsets_mapping=offsets)
        prompt_ids += enc["input_ids"]
        lengths.append(len(enc["input_ids"]))
        for a, b in enc["offset_mapping"] if offsets else ():
            starts.append(a + lo if b > a else -1)
            ends.append(b + lo if b > a else -1)
    context_len = lengths[0] if cut is not None else 0  # the context's own tokens
    target = inst.meta.get("tf_target", inst.answers[0])  # the gold continuation as the format writes it
    answer_ids = tokenizer(answer_text(text, target, inst.meta.get("answer_joined", False)),
                           add_special_tokens=False)["input_ids"]
    total = len(prompt_ids) + len(answer_ids)
    if max_positions and total > max_positions:
        raise ContextTooLongError(
            f"instance {inst.id}: {total} tokens, longer than the model's maximum of {max_positions} positions; "
            "use a shorter task setting (fewer items / smaller --length)"
        )
    spans = token_spans(inst, text.find(inst.prompt), starts, ends) if offsets else None
    return Encoded(inst, prompt_ids, answer_ids, context_len, spans)


def token_spans(inst: Instance, at: int, starts: list[int], ends: list[int]) -> list[tuple[int, int]]:
    """The token spans of ``inst``'s records (character spans of its prompt, which starts at ``at`` in the
    text the tokens come from): for each record, the first and one past the last token overlapping it."""
    lows, highs = torch.tensor(starts), torch.tensor(ends)
    out = []
    for start, end in inst.meta["item_spans"]:
        inside = torch.nonzero((lows < end + at) & (highs > start + at)).flatten()
        if not len(inside):
            raise ValueError(f"instance {inst.id}: an item covers no token")
        out.append((int(inside[0]), int(inside[-1]) + 1))
    return out


def item_token_spans(tokenizer, inst: Instance, chat: bool) -> list[tuple[int, int]]:
    """The token spans ``[(start, end), ...]`` of the instance's items in its encoded prompt ids
    (:attr:`Encoded.item_spans`); a one-line error for a task without records or a slow tokenizer."""
    if not inst.meta.get("item_spans"):
        raise ValueError(f"instance {inst.id}: task {inst.task!r} gives no record spans (the attention diagnostic "
                         "covers tasks made of records: kv, kv-uuid, mdqa)")
    if not getattr(tokenizer, "is_fast", False):
        raise ValueError("the attention diagnostic needs a fast tokenizer (character offsets)")
    return encode(tokenizer, inst, chat).item_spans


def left_pad(rows: Sequence[Sequence[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Left-pad token rows.

    Returns:
        input_ids (B, T), attention_mask (B, T) and position_ids (B, T) with position 0 at each
        row's first real token.
    """
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for b, r in enumerate(rows):
        if r:
            ids[b, width - len(r):] = torch.tensor(r, dtype=torch.long)
            mask[b, width - len(r):] = 1
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    return ids, mask, positions


def length_sorted_batches(encoded: Sequence[Encoded], batch_size: int) -> Iterator[list[Encoded]]:
    """Batches of similar total length (less padding); order inside the run does not matter."""
    if batch_size < 1:
        raise ValueError(f"batch size must be >= 1, got {batch_size}")
    order = sorted(encoded, key=lambda e: len(e.prompt_ids) + len(e.answer_ids))
    for start in range(0, len(order), batch_size):
        yield order[start:start + batch_size]


def pad_id_of(tokenizer) -> int:
    """The tokenizer's pad id (0 when it has none; padded positions are masked anyway)."""
    return tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0


def eos_ids_of(tokenizer) -> set[int]:
    """The tokenizer's end-of-sequence id(s) as a set (empty when it has none)."""
    eos = tokenizer.eos_token_id
    return set(eos if isinstance(eos, list) else [eos]) - {None}


def model_max_positions(model) -> int:
    """``max_position_embeddings`` of a model, or 0 when it has no limit (e.g. NoPE / BAM models)."""
    cfg = getattr(model, "config", None)
    if cfg is None or getattr(cfg, "extrapolates", False):
        return 0
    return int(getattr(cfg, "max_position_embeddings", 0) or 0)
