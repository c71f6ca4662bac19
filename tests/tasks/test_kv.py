"""kv and kv-uuid generators and the lost-in-the-middle KV file loader."""
from __future__ import annotations

import gzip
import json
import re

import pytest

from posbias.tasks import WORDS, make_instances
from posbias.tasks.kv import format_json_records

DEPTHS = [0.0, 0.25, 0.5, 0.75, 1.0]


def records_of(prompt: str) -> list[tuple[str, str]]:
    body = prompt.split("\n\n")[1]
    return [tuple(line.split(": ")) for line in body.splitlines()]


def test_word_list():
    assert len(WORDS) >= 300
    assert len(set(WORDS)) == len(WORDS)
    assert all(re.fullmatch(r"[a-z]+", w) for w in WORDS)


def test_kv_gold_at_requested_index_and_same_content():
    xs = make_instances("kv", n=4, depths=DEPTHS, seed=3, num_keys=12)
    for x in xs:
        recs = records_of(x.prompt)
        assert len(recs) == x.num_items == 12
        assert x.gold_index == round(x.depth * 11)
        assert recs[x.gold_index] == (x.meta["key"], x.answers[0])
        assert x.prompt.endswith(f"\n\nKey: {x.meta['key']}\nCorresponding value:")
        assert re.fullmatch(r"[1-9]\d{6}", x.answers[0])
        assert x.metric == "substring" and x.answer_prefix == ""
        assert len({k for k, _ in recs}) == 12 and len({v for _, v in recs}) == 12
    # same records at every depth: only the gold pair moves
    for i in range(4):
        per_depth = [xs[j * 4 + i] for j in range(len(DEPTHS))]
        sets = {frozenset(records_of(x.prompt)) for x in per_depth}
        assert len(sets) == 1
        others = [[r for r in records_of(x.prompt) if r[0] != x.meta["key"]] for x in per_depth]
        assert all(o == others[0] for o in others)


def test_kv_determinism_and_splits():
    a = make_instances("kv", n=5, depths=[0.5], seed=1)
    b = make_instances("kv", n=5, depths=[0.5], seed=1)
    assert [x.prompt for x in a] == [x.prompt for x in b]
    c = make_instances("kv", n=5, depths=[0.5], seed=2)
    assert {x.prompt for x in a}.isdisjoint({x.prompt for x in c})
    s = make_instances("kv", n=5, depths=[0.5], seed=1, split="search")
    assert {x.prompt for x in a}.isdisjoint({x.prompt for x in s})
    assert {x.id for x in a}.isdisjoint({x.id for x in s})


def test_kv_options():
    x = make_instances("kv", n=1, depths=[1.0], num_keys=3, value_digits=4)[0]
    assert x.num_items == 3 and re.fullmatch(r"[1-9]\d{3}", x.answers[0])
    with pytest.raises(ValueError, match=rf"num_keys=9999 .*{len(WORDS)}"):
        make_instances("kv", n=1, depths=[0.0], num_keys=9999)
    with pytest.raises(ValueError, match="num_keys must be >= 1"):
        make_instances("kv", n=1, depths=[0.0], num_keys=0)


def test_kv_uuid_generated():
    xs = make_instances("kv-uuid", n=2, depths=[0.0, 1.0], seed=0, num_keys=6)
    for x in xs:
        body = x.prompt.split("JSON data:\n")[1].split("\n\nKey:")[0]
        obj = json.loads(body)
        assert list(obj)[x.gold_index] == x.meta["key"] and obj[x.meta["key"]] == x.answers[0]
        assert len(obj) == x.num_items == 6
        assert len(body.splitlines()) == 6
        assert x.prompt.endswith(f'Key: "{x.meta["key"]}"\nCorresponding value:')
    assert xs[0].answers == xs[2].answers
    assert make_instances("kv-uuid", n=1, depths=[0.0])[0].num_items == 75


def test_format_json_records():
    assert format_json_records([("a", "1"), ("b", "2")]) == '{"a": "1",\n "b": "2"}'


def write_gz(path, lines):
    with gzip.open(path, "wt", encoding="utf-8") as f:
        for line in lines:
            f.write((line if isinstance(line, str) else json.dumps(line)) + "\n")
    return path


def kv_record(i: int, num: int = 5, gold: int = 2):
    recs = [[f"k{i}-{j}", f"v{i}-{j}"] for j in range(num)]
    return {"ordered_kv_records": recs, "key": recs[gold][0], "value": recs[gold][1]}


def test_kv_uuid_file(tmp_path):
    path = write_gz(tmp_path / "kv.jsonl.gz", [kv_record(i) for i in range(6)])
    ev = make_instances("kv-uuid", n=3, depths=[0.0, 1.0], seed=0, path=str(path))
    se = make_instances("kv-uuid", n=3, depths=[0.0, 1.0], seed=0, split="search", path=path)
    assert {x.meta["example"] for x in ev} == {1, 3, 5}  # odd example indices -> eval
    assert {x.meta["example"] for x in se} == {0, 2, 4}
    for x in ev + se:
        obj = json.loads(x.prompt.split("JSON data:\n")[1].split("\n\nKey:")[0])
        keys = list(obj)
        assert keys[x.gold_index] == x.meta["key"] and obj[x.meta["key"]] == x.answers[0]
        i = x.meta["example"]
        others = [k for k in keys if k != x.meta["key"]]
        assert others == [f"k{i}-{j}" for j in (0, 1, 3, 4)]  # pop + insert keeps the order
    assert ev[0].gold_index == 0 and ev[3].gold_index == 4
    sub = make_instances("kv-uuid", n=1, depths=[0.5], path=path, num_keys=3)[0]
    assert sub.num_items == 3 and sub.answers[0] in sub.prompt
    with pytest.raises(ValueError, match="num_keys=9 is more than the 5 keys"):
        make_instances("kv-uuid", n=1, depths=[0.5], path=path, num_keys=9)
    with pytest.raises(ValueError, match="n=4 is more than the 3 examples"):
        make_instances("kv-uuid", n=4, depths=[0.5], path=path)


def test_kv_uuid_file_errors(tmp_path):
    bad = write_gz(tmp_path / "bad.jsonl.gz", [kv_record(0), "{not json", kv_record(2)])
    with pytest.raises(ValueError, match=r"bad\.jsonl\.gz:2: malformed"):
        make_instances("kv-uuid", n=1, depths=[0.0], path=bad)
    rec = kv_record(1)
    del rec["value"]
    missing = write_gz(tmp_path / "missing.jsonl.gz", [kv_record(0), rec])
    with pytest.raises(ValueError, match=r"missing\.jsonl\.gz:2: missing field 'value'"):
        make_instances("kv-uuid", n=1, depths=[0.0], path=missing)
    rec = kv_record(0)
    rec["key"] = "absent"
    nogold = write_gz(tmp_path / "nogold.jsonl.gz", [rec])
    with pytest.raises(ValueError, match=r"nogold\.jsonl\.gz:1: key 'absent' occurs 0 times"):
        make_instances("kv-uuid", n=1, depths=[0.0], path=nogold)
    with pytest.raises(ValueError, match="nope.jsonl.gz.*not found"):
        make_instances("kv-uuid", n=1, depths=[0.0], path=tmp_path / "nope.jsonl.gz")


def test_compound_keys_are_distinct_words_and_single_word_keys_unchanged():
    from posbias.tasks.kv import WORDS, make_kv

    one = make_kv(n=3, depths=[0.5], seed=0, split="eval", num_keys=20)
    same = make_kv(n=3, depths=[0.5], seed=0, split="eval", num_keys=20, key_words=1)
    assert [i.prompt for i in one] == [i.prompt for i in same]
    two = make_kv(n=3, depths=[0.0, 1.0], seed=0, split="eval", num_keys=20, key_words=2)
    for inst in two:
        lines = inst.prompt.split("\n\n")[1].splitlines()
        keys = [line.split(":")[0] for line in lines]
        words = [w for k in keys for w in k.split("-")]
        assert len(keys) == 20 and all(len(k.split("-")) == 2 for k in keys)
        assert len(set(words)) == 40 and set(words) <= set(WORDS)
        assert inst.meta["key"] == keys[inst.gold_index] and f"Key: {inst.meta['key']}\n" in inst.prompt
    with pytest.raises(ValueError, match="key_words"):
        make_kv(n=1, depths=[0.5], seed=0, split="eval", num_keys=400, key_words=2)


def test_kv_uuid_teacher_forced_target_opens_the_json_string(tiny_tokenizer):
    """The JSON format makes most models answer '"<uuid>'; the teacher-forced gold follows it, and the
    bare value after a space (Gemma 3 and SmolLM2 drop the quote) is the accepted other form (the
    generation metric, value in prediction, is unchanged)."""
    from posbias.evaluation.batching import encode
    from posbias.evaluation.teacher_forced import alternative_instances

    inst = make_instances("kv-uuid", n=1, depths=[0.5], seed=0, split="eval", num_keys=5)[0]
    assert inst.meta["tf_target"] == '"' + inst.answers[0]
    enc = encode(tiny_tokenizer, inst, chat=False)
    assert tiny_tokenizer.decode(enc.answer_ids) == ' "' + inst.answers[0]
    (bare,) = alternative_instances(inst)
    assert tiny_tokenizer.decode(encode(tiny_tokenizer, bare, chat=False).answer_ids) == " " + inst.answers[0]
    word = make_instances("kv", n=1, depths=[0.5], seed=0, split="eval", num_keys=5)[0]
    assert "tf_target" not in word.meta


@pytest.mark.parametrize("task,opts", [("kv", {"num_keys": 7}), ("kv", {"num_keys": 7, "shared_context": True}),
                                       ("kv-uuid", {"num_keys": 6})])
def test_item_spans_cover_each_record(task, opts):
    for x in make_instances(task, n=2, depths=[0.0, 0.5, 1.0], **opts):
        spans = x.meta["item_spans"]
        assert len(spans) == x.num_items
        lines = [x.prompt[a:b] for a, b in spans]
        assert all("\n" not in line for line in lines)
        assert x.answers[0] in lines[x.gold_index]
        assert sum(x.answers[0] in line for line in lines) == 1


@pytest.mark.parametrize("shared", [False, True])
def test_a_closing_line_after_the_records(shared):
    plain = make_instances("kv", n=1, depths=[1.0], num_keys=5, shared_context=shared)[0]
    closed = make_instances("kv", n=1, depths=[1.0], num_keys=5, shared_context=shared,
                            closing="That is the whole {list}.")[0]
    last = plain.prompt[slice(*plain.meta["item_spans"][-1])]
    assert closed.prompt == plain.prompt.replace(f"{last}\n\n", f"{last}\nThat is the whole {{list}}.\n\n")
    assert closed.meta["item_spans"] == plain.meta["item_spans"] and closed.answers == plain.answers
    if shared:
        assert closed.prompt[:closed.meta["context_chars"]].endswith("That is the whole {list}.\n\n")
    with pytest.raises(ValueError, match="one line"):
        make_instances("kv", n=1, depths=[1.0], num_keys=5, closing="a\nb")


def test_query_aware_puts_the_key_before_the_records_too():
    shared = make_instances("kv", n=2, depths=[0.0, 1.0], num_keys=5, shared_context=True)
    aware = make_instances("kv", n=2, depths=[0.0, 1.0], num_keys=5, shared_context=True, query_aware=True)
    for a, b in zip(shared, aware):
        key = a.meta["key"]
        assert b.id == a.id and b.answers == a.answers and b.gold_index == a.gold_index  # the same questions
        assert b.prompt.startswith(a.prompt.split("\n\n")[0] + f"\n\nKey: {key}\n\n")
        assert b.prompt.endswith(a.prompt[a.prompt.rindex("\n\nKey:"):])
        assert "context_id" in a.meta and "context_id" not in b.meta  # each its own prompt now
        assert [b.prompt[x:y] for x, y in b.meta["item_spans"]] == [a.prompt[x:y] for x, y in a.meta["item_spans"]]
    moved = make_instances("kv", n=1, depths=[0.5], num_keys=5, query_aware=True)[0]
    assert moved.prompt.count(f"Key: {moved.meta['key']}\n") == 2
