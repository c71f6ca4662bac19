"""Multi-document QA (lost-in-the-middle NQ-Open): move the gold document to the requested index.

Two file formats, detected from the records:

* lost-in-the-middle ``nq-open-*_total_documents_gold_at_*.jsonl.gz``: several ``ctxs`` with
  exactly one ``isgold``; the gold is moved (pop + insert) and the first ``num_docs - 1`` other
  documents (retrieval order) are kept.
* ``nq-open-oracle.jsonl.gz``: one ``ctxs`` entry, the gold passage; distractors are the gold
  passages of other questions containing none of this question's answers (case-insensitive),
  drawn with the seeded rng.

Splits: even example indices (file order) are ``search``, odd ones ``eval``.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from posbias.tasks.base import Instance, check_file, check_int, depth_to_index, derive_rng, instance_id, realised_depth
from posbias.tasks.kv import move, pick_examples, record_field
from posbias.utils.io import iter_jsonl_gz

QA_PROMPT = (
    "Write a high-quality answer for the given question using only the provided search results "
    "(some of which might be irrelevant).\n\n{docs}\n\nQuestion: {question}\nAnswer:"
)


def format_docs(docs: list[dict[str, str]]) -> str:
    return "\n".join(f"Document [{i}](Title: {d['title']}) {d['text']}" for i, d in enumerate(docs, 1))


def _doc(ctx: Any, where: str) -> dict[str, Any]:
    if not isinstance(ctx, dict):
        raise ValueError(f"{where}: ctxs entries must be objects")
    return {"title": record_field(ctx, "title", where, str), "text": record_field(ctx, "text", where, str),
            "isgold": bool(ctx.get("isgold", False))}


def load_qa_file(path: str | Path) -> tuple[str, list[dict[str, Any]]]:
    """Read an NQ-Open file; returns ``(format, examples)`` with format ``"oracle"`` or ``"litm"``."""
    path = check_file(path)
    data = []
    for no, rec in iter_jsonl_gz(path):
        where = f"{path}:{no}"
        question = record_field(rec, "question", where, str)
        answers = record_field(rec, "answers", where, list)
        if not answers or not all(isinstance(a, str) for a in answers):
            raise ValueError(f"{where}: 'answers' must be a non-empty list of strings")
        ctxs = record_field(rec, "ctxs", where, list)
        if not ctxs:
            raise ValueError(f"{where}: 'ctxs' is empty")
        data.append({"question": question, "answers": answers,
                     "docs": [_doc(c, where) for c in ctxs], "line": no})
    if not data:
        raise ValueError(f"{path}: no examples")
    fmt = "oracle" if all(len(d["docs"]) == 1 for d in data) else "litm"
    for d in data:
        if fmt == "oracle":
            d["gold"] = 0
            continue
        gold = [j for j, doc in enumerate(d["docs"]) if doc["isgold"]]
        if len(gold) != 1:
            raise ValueError(f"{path}:{d['line']}: expected exactly one ctxs entry with isgold=true, "
                             f"found {len(gold)}")
        d["gold"] = gold[0]
    return fmt, data


def contains_answer(doc: dict[str, str], answers: list[str]) -> bool:
    hay = (doc["title"] + "\n" + doc["text"]).lower()
    return any(a.lower() in hay for a in answers if a.strip())


def oracle_distractors(data: list[dict[str, Any]], ex: int, k: int, rng) -> list[dict[str, str]]:
    """``k`` gold passages of other questions that contain none of question ``ex``'s answers."""
    answers = data[ex]["answers"]
    seen = {data[ex]["docs"][0]["text"]}
    out = []
    for j in rng.permutation(len(data)):
        if j == ex:
            continue
        doc = data[j]["docs"][0]
        if doc["text"] in seen or contains_answer(doc, answers):
            continue
        seen.add(doc["text"])
        out.append({"title": doc["title"], "text": doc["text"], "isgold": False})
        if len(out) == k:
            return out
    raise ValueError(f"only {len(out)} usable distractors for example {ex} (num_docs needs {k})")


def make_mdqa(*, tokenizer=None, n, depths, seed, split, path=None, num_docs=10) -> list[Instance]:
    task = "mdqa"
    if path is None:
        raise ValueError("task 'mdqa' needs the option path=... (an nq-open-*.jsonl.gz file, e.g. "
                         "nq-open-oracle.jsonl.gz from the lost-in-the-middle data)")
    num_docs = check_int("num_docs", num_docs)
    path = Path(path)
    fmt, data = load_qa_file(path)
    samples = []
    for ex in pick_examples(task, len(data), n, split, seed, path):
        d = data[ex]
        gold_doc = d["docs"][d["gold"]]
        if fmt == "oracle":
            rng = derive_rng(task, split, seed, ex)
            docs = [gold_doc, *oracle_distractors(data, ex, num_docs - 1, rng)]
        else:
            others = [doc for j, doc in enumerate(d["docs"]) if j != d["gold"]]
            if num_docs - 1 > len(others):
                raise ValueError(f"num_docs={num_docs} is more than the {len(d['docs'])} documents "
                                 f"of {path}:{d['line']}")
            docs = [gold_doc, *others[: num_docs - 1]]
        samples.append({"docs": docs, "ex": ex, "d": d})
    out = []
    for depth in depths:
        for i, s in enumerate(samples):
            idx = depth_to_index(depth, len(s["docs"]))
            docs = move(s["docs"], 0, idx)
            d = s["d"]
            out.append(Instance(
                id=instance_id(task, split, seed, depth, i), task=task,
                prompt=QA_PROMPT.format(docs=format_docs(docs), question=d["question"]),
                answers=list(d["answers"]), gold_index=idx, num_items=len(docs), depth=float(depth),
                metric="best_subspan_em",
                meta={"question": d["question"], "format": fmt, "source": f"{path}:{d['line']}",
                      "example": s["ex"], "realised_depth": realised_depth(idx, len(docs))},
            ))
    return out
