"""Passkey probe during training: does the model retrieve the key at its training length yet?

Small models learn retrieval through an abrupt phase change (an induction head forms); before it
every scheme is at chance on the key digits, so a length-extrapolation study is only meaningful
for models that passed it. :func:`passkey_probe` scores ``n`` fixed passkey documents (the
trainer's format, at the training context) teacher-forced: exact match of the final key and the
summed log-probability of its tokens (chance for a 5-digit key: 5 x log(1/10) = -11.5).
:func:`run_probes` does the same for each probe task: ``passkey`` and ``niah`` (single-needle RULER
documents of the training mix, the 7-digit value scored), so "solves 1x" can cover both.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from posbias.evaluation.scoring import score_token_rows
from posbias.tasks.niah import niah_document


@dataclass
class ProbeDoc:
    """One probe document: ``ids`` Long[L] and the half-open span ``[start, end)`` of the final key."""

    ids: torch.Tensor
    start: int
    end: int


PROBE_TASKS = ("passkey", "niah")


def _probe_doc(ds, text: str, answer: str) -> ProbeDoc | None:
    """``text`` (a training document ending in ``" <answer>."``) cut after the answer's tokens, with
    the answer's span; ``None`` when a merge crosses the prompt / answer boundary."""
    ids, prompt = ds.encode(text), ds.encode(text[: text.rindex(" " + answer)])
    if ids[: len(prompt)] != prompt:
        return None
    end = len(prompt) + 1
    while end < len(ids) and answer not in ds.tokenizer.decode(ids[len(prompt):end]):
        end += 1
    return ProbeDoc(torch.tensor(ids[:end]), len(prompt), end)


def passkey_probe_docs(ds, n: int, *, seed: int = 1234) -> list[ProbeDoc]:
    """``n`` passkey documents of the dataset's format and length (fixed by ``seed``)."""
    rng = np.random.default_rng([seed, 99])
    docs = []
    for _ in range(n):
        key, units, position = ds.passkey_draw(rng)
        docs.append(_probe_doc(ds, ds.passkey_text(key, units, position), key))
    return [d for d in docs if d is not None]


def niah_probe_docs(ds, n: int, *, seed: int = 1234) -> list[ProbeDoc]:
    """``n`` single-needle NIAH documents of the dataset's format and length (fixed by ``seed``);
    the span is the needle's 7-digit value."""

    rng = np.random.default_rng([seed, 98])
    docs = []
    for _ in range(n):
        key, value, units, position = ds.niah_draw(rng)
        docs.append(_probe_doc(ds, niah_document(key, value, units, position), value))
    return [d for d in docs if d is not None]


def probe_docs(ds, n: int, tasks: tuple[str, ...]) -> dict[str, list[ProbeDoc]]:
    """``{task: n probe documents}`` for each of ``tasks`` (a subset of :data:`PROBE_TASKS`)."""
    makers = {"passkey": passkey_probe_docs, "niah": niah_probe_docs}
    return {t: makers[t](ds, n) for t in tasks}


def run_probes(model, docs_by_task: dict[str, list[ProbeDoc]]) -> dict:
    """``{"<task>_em": fraction exact, "<task>_logprob": mean summed log-prob}`` for each task."""
    out = {}
    for task, docs in docs_by_task.items():
        out[f"{task}_em"], out[f"{task}_logprob"] = _score_spans(model, docs)
    return out


def probe_postfix(probe: dict) -> dict[str, str]:
    """A progress bar's view of :func:`run_probes`' result: ``{"passkey": "85%"}`` per task scored."""
    return {key.removesuffix("_em"): f"{100 * value:.0f}%" for key, value in probe.items()
            if key.endswith("_em") and value is not None}


def passkey_probe(model, docs: list[ProbeDoc]) -> dict:
    """``{"passkey_em": fraction exact, "passkey_logprob": mean summed log-prob of the key tokens}``."""
    em, logprob = _score_spans(model, docs)
    return {"passkey_em": em, "passkey_logprob": logprob}


@torch.no_grad()
def _score_spans(model, docs: list[ProbeDoc]) -> tuple[float | None, float | None]:
    """Teacher-forced over each document's span: (fraction exact, mean summed log-prob); None, None for no docs."""

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
    return (float(np.mean(em)) if em else None), (float(np.mean(lp)) if lp else None)
