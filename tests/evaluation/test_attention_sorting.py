"""Attention sorting: records re-shown by the attention they receive, scored at the depth they were asked at."""
from __future__ import annotations

import json

import pytest
from conftest import make_tiny_model, save_tiny_folder
from typer.testing import CliRunner

from posbias.evaluation.attention_probe import AttentionProbe, probe_of
from posbias.evaluation.attention_sorting import attention_sorted, record_attention, sorting_order
from posbias.methods import apply_method
from posbias.tasks import make_instances
from posbias.utils.io import read_jsonl


def test_sorting_order_puts_the_most_attended_last_or_first():
    means = [0.2, 0.9, 0.1, 0.5]
    assert sorting_order(means, "last") == [2, 0, 3, 1]
    assert sorting_order(means, "first") == [1, 3, 0, 2]
    assert sorting_order([0.3, 0.3, 0.1], "last") == [2, 0, 1]  # ties keep the current order
    with pytest.raises(ValueError, match="most_attended"):
        sorting_order(means, "middle")


def test_one_round_sorts_by_the_attention_measured_and_keeps_what_was_asked(tiny_tokenizer):
    model = make_tiny_model("qwen2")
    insts = make_instances("kv", n=2, depths=[0.0, 0.5, 1.0], seed=0, num_keys=6, shared_context=True)
    means = record_attention(model, tiny_tokenizer, insts, chat=False, batch_size=4)
    assert probe_of(model) is None and all(len(m) == 6 for m in means)  # its own probe, removed after
    sorted_ = attention_sorted(model, tiny_tokenizer, insts, rounds=1, most_attended="last", batch_size=4)
    for before, after, m in zip(insts, sorted_, means):
        order = sorting_order(m, "last")
        assert after.meta["order"] == order and after.id == before.id and after.depth == before.depth
        assert after.gold_index == order.index(before.gold_index)
        assert after.meta["original_gold_index"] == before.gold_index and "context_id" not in after.meta
    twice = attention_sorted(model, tiny_tokenizer, insts, rounds=2, batch_size=4)
    assert all(sorted(t.meta["order"]) == list(range(6)) and t.meta["original_gold_index"] == i.gold_index
               for t, i in zip(twice, insts))


def test_an_active_probe_is_used_and_keeps_its_own_setting(tiny_tokenizer):
    model = make_tiny_model("llama")
    insts = make_instances("kv", n=1, depths=[0.5], seed=0, num_keys=5)
    with AttentionProbe(model) as probe:
        own = record_attention(model, tiny_tokenizer, insts, chat=False, batch_size=2)
        assert probe_of(model) is probe and probe.record_means is False
    assert own == record_attention(model, tiny_tokenizer, insts, chat=False, batch_size=2)


def test_the_method_leaves_the_model_unchanged_and_checks_its_options(tiny_tokenizer):
    model = make_tiny_model("llama")
    with apply_method(model, "attention-sorting", rounds=2, most_attended="first") as handle:
        assert handle.model is model and handle.options == {"rounds": 2, "most_attended": "first"}
    with pytest.raises(ValueError, match="most_attended"):
        apply_method(model, "attention-sorting", most_attended="middle")
    with pytest.raises(ValueError, match="rounds"):
        apply_method(model, "attention-sorting", rounds=0)


def test_eval_with_attention_sorting_records_where_the_gold_was_asked(tmp_path):
    from posbias.cli.main import app

    folder = save_tiny_folder(tmp_path / "tiny", "qwen2", max_positions=4096)
    out = tmp_path / "run"
    res = CliRunner().invoke(app, ["eval", "--model", folder, "--task", "kv", "--num-keys", "6", "--n", "2",
                                   "--depths", "0,0.5,1", "--opt", "shared_context=true", "--method",
                                   "attention-sorting", "--mode", "both", "--max-new-tokens", "3", "--attention",
                                   "--out", str(out)])
    assert res.exit_code == 0, res.output
    recs = read_jsonl(out / "results.jsonl")
    asked = {i.id: i for i in make_instances("kv", n=2, depths=[0.0, 0.5, 1.0], seed=0, num_keys=6,
                                             shared_context=True)}
    assert len(recs) == 6 and all(r["original_gold_index"] == asked[r["id"]].gold_index for r in recs)
    assert all(r["depth"] == asked[r["id"]].depth and "attn_gold_rank" in r and "prediction" in r for r in recs)
    assert json.loads((out / "config.json").read_text())["config"]["method"] == "attention-sorting"
