"""Passkey probe during training: does the model retrieve the key at its training length yet?

Small models learn retrieval through an abrupt phase change (an induction head forms); before it
every scheme is at chance on the key digits, so a length-extrapolation study is only meaningful
for models that passed it. :func:`passkey_probe` scores ``n`` fixed passkey documents (the
trainer's format, at the training context) teacher-forced: exact match of the final key and the
summed log-probability of its tokens (chance for a 5-digit key: 5 x log(1/10) = -11.5).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


@dataclass
class ProbeDoc:
    """One probe document: ``ids`` Long[L] and the half-open span ``[start, end)`` of the final key."""

    ids: torch.Tensor
    start: int
    end: int


def passkey_probe_docs(ds, n: int, *, seed: int = 1234) -> list[ProbeDoc]:
    """``n`` passkey documents of the dataset's format and length (fixed by ``seed``)."""
    rng = np.random.default_rng([seed, 99])
    docs = []
    for _ in range(n):
        key, units, position = ds.passkey_draw(rng)
        text = ds.passkey_text(key, units, position)
        ids, prompt = ds.encode(text), ds.encode(text[: text.rindex(" " + key)])
        if ids[: len(prompt)] != prompt:  # a merge across the prompt / answer boundary: skip
            continue
        end = len(prompt) + 1
        while end < len(ids) and key not in ds.tokenizer.decode(ids[len(prompt):end]):
            end += 1
        docs.append(ProbeDoc(torch.tensor(ids[:end]), len(prompt), end))
    return docs


@torch.no_grad()
def passkey_probe(model, docs: list[ProbeDoc]) -> dict:
    """``{"passkey_em": fraction exact, "passkey_logprob": mean summed log-prob of the key tokens}``."""
    from posbias.evaluation.scoring import score_token_rows

    was_training = model.training
    model.eval()
    em, lp = [], []
    try:
        for d in docs:  # one document at a time: their lengths differ
            ids = d.ids.tolist()
            r = score_token_rows(model, [ids[: d.start]], [ids[d.start: d.end]], pad_id=0)[0]
            em.append(r["em"])
            lp.append(r["logprob"])
    finally:
        model.train(was_training)
    return {"passkey_em": float(np.mean(em)) if em else None, "passkey_logprob": float(np.mean(lp)) if lp else None}
