"""Failure classes of a map's wrong answers: worded, another item (with its offset), not in context, format."""
import pytest

from posbias.evaluation.map_failures import classify, context_values, failure_summary
from posbias.tasks import make_instances


@pytest.fixture(scope="module")
def kv():
    return make_instances("kv", n=1, depths=[0.5], num_keys=9, shared_context=True)[0]


def test_kv_context_values_are_the_records_in_order(kv):
    values = context_values("kv", kv.prompt)
    assert len(values) == 9 and values[kv.gold_index] == kv.answers[0]


def test_each_failure_class(kv):
    values, gold = context_values("kv", kv.prompt), kv.answers[0]
    assert classify("kv", kv.prompt, gold, f"\n{gold}\n") == {"failure": "worded"}
    assert classify("kv", kv.prompt, gold, f" {values[kv.gold_index - 1]}") == {
        "failure": "other_item", "offset": -1, "retrieved": values[kv.gold_index - 1]}
    assert classify("kv", kv.prompt, gold, f" {values[-1]}")["offset"] == 8 - kv.gold_index
    assert classify("kv", kv.prompt, gold, " 1")["failure"] == "not_in_context"
    assert classify("kv", kv.prompt, gold, " I do not know")["failure"] == "format"


def test_niah_needles_are_items():
    prompt = ("One of the special magic numbers for a-b is: 111. filler "
              "One of the special magic numbers for c-d is: 222. What is ...")
    assert context_values("niah", prompt) == ["111", "222"]
    assert classify("niah", prompt, "222", " 111.")["offset"] == -1


def test_failure_summary_counts_and_offsets():
    recs = [{"method": "none", "length": 100, "failure": "correct"},
            {"method": "none", "length": 100, "failure": "other_item", "offset": -1},
            {"method": "none", "length": 200, "failure": "other_item", "offset": -1},
            {"method": "none", "length": 200, "failure": "format"}]
    f = failure_summary(recs, ["none"])["none"]
    assert f["counts"] == {"correct": 1, "worded": 0, "other_item": 2, "not_in_context": 0, "format": 1,
                           "wrong_answer": 0}
    assert f["offsets"] == {"-1": 2} and f["by_length"]["200"]["format"] == 1


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_generation_from_one_context_prefill_equals_one_prompt_per_question(arch, tiny_tokenizer):
    from conftest import make_tiny_model

    from posbias.evaluation.generation import greedy_generate
    from posbias.evaluation.map_failures import generate_from_context

    model = make_tiny_model(arch)
    insts = [i for i in make_instances("kv", n=1, depths=[0.0, 0.3, 0.6, 1.0], num_keys=12, shared_context=True)]
    # keys of different token lengths: the questions are left-padded against each other
    shared = generate_from_context(model, tiny_tokenizer, insts, max_new_tokens=6, batch_size=3)
    alone = greedy_generate(model, tiny_tokenizer, insts, max_new_tokens=6, batch_size=1)
    assert shared == alone and any(shared)


def test_wrong_answers_are_generated_long_enough_to_classify(tiny_tokenizer, monkeypatch):
    """A UUID answer gets the tokens it needs (a fixed 16 cut it, so every wrong UUID was "format");
    older map folders, which recorded 16, resume unless they generated UUIDs under it."""
    from types import SimpleNamespace

    import posbias.evaluation.map_failures as mf
    from posbias.evaluation.bias_map import upgrade_map_settings
    from posbias.evaluation.generation import generation_budget

    insts = make_instances("kv-uuid", n=2, depths=[0.5], num_keys=5)
    seen = []
    monkeypatch.setattr(mf, "greedy_generate", lambda m, t, wrong, **kw: seen.append(kw["max_new_tokens"])
                        or [" x"] * len(wrong))
    records = [{"correct": 0.0} for _ in insts]
    mf.classify_group(object(), tiny_tokenizer, insts, records, SimpleNamespace(max_new_tokens=None, batch_size=2,
                                                                                  task="kv-uuid"))
    assert seen == [generation_budget(tiny_tokenizer, insts)] and seen[0] > 16
    assert [r["failure"] for r in records] == ["format", "format"]
    assert upgrade_map_settings({"task": "kv", "mode": "both", "max_new_tokens": 16})["max_new_tokens"] is None
    assert upgrade_map_settings({"task": "kv-uuid", "mode": "teacher-forced", "max_new_tokens": 16})[
        "max_new_tokens"] is None
    assert upgrade_map_settings({"task": "kv-uuid", "mode": "both", "max_new_tokens": 16})["max_new_tokens"] == 16


def test_free_text_answers_are_judged_by_the_task_metric(monkeypatch, tmp_path):
    """Multi-document QA has no item values to look for: a wrong teacher-forced answer is ``worded`` when the
    reference metric (best_subspan_em) finds an alias in the generation, else ``wrong_answer``."""
    import gzip
    import json
    from types import SimpleNamespace

    from posbias.evaluation import map_failures

    recs = [{"question": f"q{i}?", "answers": [f"Paris {i}", f"P{i}"],
             "ctxs": [{"title": f"T{i}", "text": f"text {i}"}]} for i in range(8)]
    path = tmp_path / "nq.jsonl.gz"
    path.write_bytes(gzip.compress(("\n".join(json.dumps(r) for r in recs) + "\n").encode()))
    insts = make_instances("mdqa", n=2, depths=[0.0], path=path, num_docs=3)
    a, b = (i.meta["example"] for i in insts)
    monkeypatch.setattr(map_failures, "greedy_generate",
                        lambda *args, **kw: [f"The answer is the paris {a}.", "Berlin"])
    monkeypatch.setattr(map_failures, "generation_budget", lambda *args, **kw: 8)
    records = [{"correct": 0.0}, {"correct": 0.0}]
    map_failures.classify_group(None, None, insts, records, SimpleNamespace(task="mdqa", max_new_tokens=None,
                                                                           batch_size=2))
    assert [r["failure"] for r in records] == ["worded", "wrong_answer"]
    assert b != a
