"""Multi-document QA (lost-in-the-middle NQ-Open): move the gold document to the requested index.

Two file formats, detected from the records:

* lost-in-the-middle ``nq-open-*_total_documents_gold_at_*.jsonl.gz``: several ``ctxs`` with
  exactly one ``isgold``; the gold is moved (pop + insert) and the first ``num_docs - 1`` other
  documents (retrieval order) are kept.
* ``nq-open-oracle.jsonl.gz``: one ``ctxs`` entry, the gold passage; distractors are the gold
  passages of other questions containing none of this question's answers (case-insensitive),
  drawn with the seeded rng (easy distractors: other topics).
* HotpotQA's distractor setting (``path=hotpotqa`` or a ``.json`` file, :mod:`posbias.tasks.hotpotqa`):
  two gold paragraphs and eight retrieved look-alikes (hard distractors), padded with other questions'
  paragraphs beyond ten documents.

Splits: even example indices (file order) are ``search``, odd ones ``eval``.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from posbias.tasks.base import (
    MAX_DOCUMENTS,
    Instance,
    check_depth,
    check_file,
    check_int,
    derive_rng,
    instance_id,
    realised_depth,
    render_items,
)
from posbias.tasks.hotpotqa import is_hotpotqa, load_hotpotqa
from posbias.tasks.kv import pick_examples, record_field
from posbias.utils.io import iter_jsonl_gz

QA_PROMPT = (
    "Write a high-quality answer for the given question using only the provided search results "
    "(some of which might be irrelevant).\n\n{docs}\n\nQuestion: {question}\nAnswer:"
)


LABEL = re.compile(r"^Document \[\d+\]")


def doc_lines(docs: list[dict[str, str]]) -> list[str]:
    """``Document [i](Title: ...) text``, i = 1 .. N in the order shown."""
    return [f"Document [{i}](Title: {d['title']}) {d['text']}" for i, d in enumerate(docs, 1)]


def relabel_document(text: str, position: int) -> str:
    """A document line of :func:`doc_lines` numbered for ``position`` (0-based) in the order shown."""
    return LABEL.sub(f"Document [{position + 1}]", text, count=1)


def format_docs(docs: list[dict[str, str]]) -> str:
    return "\n".join(doc_lines(docs))


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


def make_mdqa(*, tokenizer=None, n, depths, seed, split, path=None, num_docs=10, query_aware=False) -> list[Instance]:
    """Multi-document QA: ``num_docs`` documents, the gold moved to each depth (module docstring).

    The gold block (one document; HotpotQA's two supporting paragraphs, kept adjacent in supporting-fact
    order) starts at document ``round(depth * (num_docs - g))`` for a block of ``g``; the documents are
    numbered 1 .. ``num_docs`` in the order shown (the lost-in-the-middle layout), so a label never tells
    where the gold came from. Teacher forcing scores the shortest answer alias (``meta["tf_target"]``) and
    accepts the others (``meta["tf_alternatives"]``); generation is scored by ``best_subspan_em``.
    ``query_aware``: the question also before the documents (query-aware contextualization, Liu et al., TACL
    2024): a prompt change, not a model fix.
    """
    task = "mdqa"
    if path is None:
        raise ValueError("task 'mdqa' needs the option path=... (an nq-open-*.jsonl.gz file, e.g. "
                         "nq-open-oracle.jsonl.gz from the lost-in-the-middle data, or hotpotqa for HotpotQA's "
                         "hard distractors)")
    num_docs = check_int("num_docs", num_docs, maximum=MAX_DOCUMENTS)
    if is_hotpotqa(path):
        samples = hotpot_samples(path, n=n, seed=seed, split=split, num_docs=num_docs)
    else:
        samples = nq_samples(path, n=n, seed=seed, split=split, num_docs=num_docs)
    out = []
    for depth in depths:
        for i, s in enumerate(samples):
            out.append(mdqa_instance(s, depth, instance_id(task, split, seed, depth, i), query_aware))
    return out


def mdqa_instance(sample: dict[str, Any], depth: float, id_: str, query_aware: bool = False) -> Instance:
    """One instance: the sample's gold block at ``depth`` among its distractors."""
    golds, others = sample["golds"], sample["distractors"]
    slots = len(others)  # the block can start before any of the distractors or after all of them
    idx = int(round(check_float_depth(depth) * slots))
    docs = others[:idx] + golds + others[idx:]
    template = QA_PROMPT.replace("{docs}", "Question: {question}\n\n{docs}") if query_aware else QA_PROMPT
    prompt, spans = render_items(template, "docs", doc_lines(docs), question=sample["question"])
    answers = list(sample["answers"])
    target = min(answers, key=len)
    return Instance(
        id=id_, task="mdqa", prompt=prompt, answers=answers, gold_index=idx, num_items=len(docs), depth=float(depth),
        metric="best_subspan_em",
        meta={"question": sample["question"], **sample["meta"], "item_spans": spans,
              "gold_items": list(range(idx, idx + len(golds))), "realised_depth": realised_depth(idx, slots + 1),
              "tf_target": target, "tf_alternatives": [f" {a}" for a in answers if a != target]},
    )


def check_float_depth(depth: float) -> float:
    check_depth(depth)
    return float(depth)


def nq_samples(path, *, n: int, seed: int, split: str, num_docs: int) -> list[dict[str, Any]]:
    """Samples of an NQ-Open file (oracle or lost-in-the-middle format)."""
    task = "mdqa"
    path = Path(path)
    fmt, data = load_qa_file(path)
    samples = []
    for ex in pick_examples(task, len(data), n, split, seed, path):
        d = data[ex]
        gold_doc = d["docs"][d["gold"]]
        if fmt == "oracle":
            others = oracle_distractors(data, ex, num_docs - 1, derive_rng(task, split, seed, ex))
        else:
            others = [doc for j, doc in enumerate(d["docs"]) if j != d["gold"]]
            if num_docs - 1 > len(others):
                raise ValueError(f"num_docs={num_docs} is more than the {len(d['docs'])} documents "
                                 f"of {path}:{d['line']}")
            others = others[: num_docs - 1]
        samples.append({"question": d["question"], "answers": d["answers"], "golds": [gold_doc], "distractors": others,
                        "meta": {"format": fmt, "source": f"{path}:{d['line']}", "example": ex}})
    return samples


def hotpot_samples(path, *, n: int, seed: int, split: str, num_docs: int) -> list[dict[str, Any]]:
    """Samples of a HotpotQA distractor file (:mod:`posbias.tasks.hotpotqa`), its examples whose answer is
    written in a gold paragraph: the two gold paragraphs, the retrieved distractors that do not hold the
    answer, padded to ``num_docs - 2`` with paragraphs of
    other questions (none holding this answer, no title twice), all distractors in a seeded order."""
    task = "mdqa"
    if num_docs < 3:
        raise ValueError(f"num_docs={num_docs}: HotpotQA needs at least 3 documents (2 gold paragraphs and a "
                         "distractor)")
    data = [d for d in load_hotpotqa(path) if any(contains_answer(g, d["answers"]) for g in d["golds"])]
    where = "hotpotqa" if str(path) == "hotpotqa" else str(path)
    pool = [doc for d in data for doc in (*d["golds"], *d["distractors"])]
    samples = []
    for ex in pick_examples(task, len(data), n, split, seed, Path(where)):
        d = data[ex]
        rng = derive_rng(task, split, seed, ex)
        hard = [doc for doc in d["distractors"] if not contains_answer(doc, d["answers"])][: num_docs - 2]
        extra = padding(pool, d, num_docs - 2 - len(hard), rng)
        others = [(hard + extra)[j] for j in rng.permutation(len(hard) + len(extra))]
        samples.append({"question": d["question"], "answers": d["answers"], "golds": d["golds"], "distractors": others,
                        "meta": {"format": "hotpotqa", "source": f"{where}[{d['line']}]", "example": ex,
                                 "hard_distractors": len(hard)}})
    return samples


def padding(pool: list[dict[str, Any]], example: dict[str, Any], k: int, rng) -> list[dict[str, Any]]:
    """``k`` paragraphs of ``pool`` (other questions') that do not hold the example's answer and whose
    titles are not among the example's."""
    titles = {doc["title"] for doc in (*example["golds"], *example["distractors"])}
    out: list[dict[str, Any]] = []
    while len(out) < k:
        for j in rng.integers(len(pool), size=2 * (k - len(out)) + 8):
            doc = pool[int(j)]
            if doc["title"] in titles or contains_answer(doc, example["answers"]):
                continue
            titles.add(doc["title"])
            out.append({**doc, "isgold": False})
            if len(out) == k:
                break
    return out
