"""The papers' answer metrics, each ``f(prediction, answers) -> float`` in [0, 1].

- ``best_subspan_em`` (lost-in-the-middle QA, Liu et al. 2023): prediction cut at its first
  newline, SQuAD-normalised; 1 if any normalised gold answer is a substring of it.
- ``substring`` (lost-in-the-middle KV retrieval): ``value.lower() in prediction.lower()``.
- ``passkey`` (Landmark attention / BAM): the first integer in the prediction equals the key.
- ``string_match_all`` (RULER): fraction of expected values found, case-insensitive.
"""
from __future__ import annotations

import re
import string
from typing import Callable, Sequence


def normalize_answer(text: str) -> str:
    """SQuAD normalisation: lowercase, drop punctuation and articles, collapse whitespace."""
    text = text.lower()
    text = "".join(ch for ch in text if ch not in set(string.punctuation))
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split())


def best_subspan_em(prediction: str, answers: Sequence[str]) -> float:
    pred = normalize_answer(prediction.strip().split("\n")[0])
    return float(any(normalize_answer(a) in pred for a in answers))


def substring(prediction: str, answers: Sequence[str]) -> float:
    pred = prediction.lower()
    return float(any(a.lower() in pred for a in answers))


def passkey(prediction: str, answers: Sequence[str]) -> float:
    found = re.search(r"\d+", prediction)
    return float(found is not None and found.group(0) == str(answers[0]).strip())


def string_match_all(prediction: str, answers: Sequence[str]) -> float:
    pred = prediction.lower()
    return sum(a.lower() in pred for a in answers) / len(answers)


METRICS: dict[str, Callable[[str, Sequence[str]], float]] = {
    "best_subspan_em": best_subspan_em,
    "substring": substring,
    "passkey": passkey,
    "string_match_all": string_match_all,
}


def score(metric: str, prediction: str, answers: Sequence[str]) -> float:
    """Score ``prediction`` with the metric named ``metric``."""
    try:
        fn = METRICS[metric]
    except KeyError:
        raise ValueError(f"unknown metric {metric!r}; known: {', '.join(METRICS)}") from None
    return fn(prediction, answers)
