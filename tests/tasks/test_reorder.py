"""Records re-shown in another order: everything else in the prompt byte for byte, labels following the order."""
from __future__ import annotations

import gzip
import json
import re

import pytest

from posbias.tasks import make_instances
from posbias.tasks.registry import reordered_instance
from posbias.tasks.reorder import reordered


def oracle(tmp_path, count=12):
    path = tmp_path / "nq-open-oracle.jsonl.gz"
    with gzip.open(path, "wt", encoding="utf-8") as f:
        for i in range(count):
            f.write(json.dumps({"question": f"question {i}?", "answers": [f"Answer{i}"],
                                "ctxs": [{"title": f"T{i}", "text": f"Passage {i}: Answer{i}.", "hasanswer": True,
                                          "isgold": True}]}) + "\n")
    return path


@pytest.mark.parametrize("task, options", [("kv", {"num_keys": 7}), ("kv", {"num_keys": 7, "shared_context": True}),
                                           ("kv-uuid", {"num_keys": 6})])
def test_the_identity_order_is_the_same_prompt_and_reversal_moves_only_records(task, options):
    inst = make_instances(task, n=1, depths=[0.5], seed=0, **options)[0]
    same = reordered_instance(inst, list(range(inst.num_items)))
    assert same.prompt == inst.prompt and same.meta["item_spans"] == inst.meta["item_spans"]
    assert same.gold_index == inst.gold_index and "context_id" not in same.meta
    back = reordered_instance(inst, list(range(inst.num_items))[::-1])
    items = [inst.prompt[s:e] for s, e in inst.meta["item_spans"]]
    shown = [back.prompt[s:e] for s, e in back.meta["item_spans"]]
    assert shown == items[::-1] and len(back.prompt) == len(inst.prompt)
    first, last = inst.meta["item_spans"][0][0], inst.meta["item_spans"][-1][1]
    assert back.prompt[:first] == inst.prompt[:first] and back.prompt[last:] == inst.prompt[last:]
    assert back.gold_index == inst.num_items - 1 - inst.gold_index and back.depth == inst.depth
    assert back.meta["order"] == list(range(inst.num_items))[::-1] and back.id == inst.id


def test_mdqa_labels_follow_the_order_shown(tmp_path):
    inst = make_instances("mdqa", n=1, depths=[0.0], seed=0, path=str(oracle(tmp_path)), num_docs=5)[0]
    order = [3, 1, 4, 0, 2]
    moved = reordered_instance(inst, order)
    labels = [int(m) for m in re.findall(r"^Document \[(\d+)\]", moved.prompt, flags=re.M)]
    assert labels == [1, 2, 3, 4, 5]
    texts = [re.sub(r"^Document \[\d+\]", "", inst.prompt[s:e]) for s, e in inst.meta["item_spans"]]
    shown = [re.sub(r"^Document \[\d+\]", "", moved.prompt[s:e]) for s, e in moved.meta["item_spans"]]
    assert shown == [texts[k] for k in order]
    assert moved.gold_index == order.index(inst.gold_index) == moved.meta["gold_items"][0] == 3
    assert "Answer" in moved.prompt[slice(*moved.meta["item_spans"][moved.gold_index])]


def test_bad_orders_are_refused(tiny_tokenizer):
    inst = make_instances("kv", n=1, depths=[0.5], seed=0, num_keys=4)[0]
    with pytest.raises(ValueError, match="permutation"):
        reordered(inst, [0, 1, 1, 2])
    passkey = make_instances("passkey", tokenizer=tiny_tokenizer, n=1, depths=[0.5], seed=0, length=256)[0]
    with pytest.raises(ValueError, match="no records to reorder"):
        reordered(passkey, [0])
