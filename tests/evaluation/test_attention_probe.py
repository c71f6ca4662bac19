"""The attention diagnostic: captured rows equal eager attention weights, on every scoring path, and
scoring is unchanged while it runs."""
from __future__ import annotations

import pytest
import torch
from conftest import make_tiny_tokenizer, make_variant_model

from posbias.evaluation import teacher_forced
from posbias.evaluation.attention_probe import AttentionProbe, gold_attention
from posbias.evaluation.batching import encode, item_token_spans
from posbias.evaluation.teacher_forced import score_instances
from posbias.tasks import make_instances

ARCHS = ["llama", "qwen2-gqa7", "gemma3"]


def kv(shared: bool, num_keys: int = 6, n: int = 2):
    return make_instances("kv", n=n, depths=[0.0, 0.5, 1.0], num_keys=num_keys, shared_context=shared)


def eager_rows(model, tok, inst) -> torch.Tensor:
    """Reference: a full eager forward with ``output_attentions``; the last prompt position's row over the
    prompt, per layer (L, H, P)."""
    e = encode(tok, inst, False)
    ids = torch.tensor([e.prompt_ids + e.answer_ids])
    model.config._attn_implementation = "eager"
    with torch.no_grad():
        out = model(input_ids=ids, output_attentions=True)
    p = len(e.prompt_ids)
    return torch.stack([a[0, :, p - 1, :p].float() for a in out.attentions])


def captured(model, tok, insts, monkeypatch, **kw):
    """What the probe hands to :func:`teacher_forced.with_attention`, by instance id."""
    rows = {}
    real = teacher_forced.with_attention

    def spy(model, tokenizer, instances, records, chat):
        probe = teacher_forced.probe_of(model)
        for inst in instances:
            rows[inst.id] = probe._rows.get(inst.id)
            rows[inst.id] = None if rows[inst.id] is None else torch.stack(
                [rows[inst.id][k] for k in sorted(rows[inst.id])])
        return real(model, tokenizer, instances, records, chat)

    monkeypatch.setattr(teacher_forced, "with_attention", spy)
    with AttentionProbe(model):
        records = score_instances(model, tok, insts, **kw)
    return records, rows


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("shared", [False, True])
@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
def test_captured_rows_equal_eager_attention(arch, shared, implementation, monkeypatch):
    model, tok = make_variant_model(arch), make_tiny_tokenizer()
    insts = kv(shared)
    model.config._attn_implementation = implementation
    records, rows = captured(model, tok, insts, monkeypatch, batch_size=4)
    for inst, rec in zip(insts, records):
        want = eager_rows(model, tok, inst)
        torch.testing.assert_close(rows[inst.id], want, atol=1e-6, rtol=1e-5)
        spans = item_token_spans(tok, inst, False)
        assert rec["attn_gold_rank"] == gold_attention(want, spans, [inst.gold_index])["attn_gold_rank"]
        model.config._attn_implementation = implementation


def test_the_cache_path_captures_the_prefill(monkeypatch):
    """A prompt-dependent model (Ms-PoE's kind) is scored by prefilling the prompt, then the answer through
    the cache: the last prompt token is in the prefill, captured there."""
    from posbias.evaluation import scoring

    model, tok = make_variant_model("qwen2-gqa7"), make_tiny_tokenizer()
    monkeypatch.setattr(scoring, "prompt_dependent", lambda m: True)
    insts = kv(False)
    _, rows = captured(model, tok, insts, monkeypatch, batch_size=3, shared=False)
    for inst in insts:
        torch.testing.assert_close(rows[inst.id], eager_rows(model, tok, inst), atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("shared", [False, True])
def test_scores_are_unchanged_while_probing(shared):
    model, tok = make_variant_model("qwen2"), make_tiny_tokenizer()
    model.config._attn_implementation = "sdpa"
    insts = kv(shared)
    plain = score_instances(model, tok, insts, batch_size=4)
    with AttentionProbe(model):
        probed = score_instances(model, tok, insts, batch_size=4)
    for a, b in zip(plain, probed):
        assert (a["em"], a["logprob"], a["hits"]) == (b["em"], b["logprob"], b["hits"])
        assert {"attn_gold_mass", "attn_gold_rank", "attn_hit_rate", "attn_layers"} <= set(b)
    assert all(not any(k.startswith("attn_") for k in r) for r in plain)
    after = score_instances(model, tok, insts, batch_size=4)  # the probe is gone
    assert [r["logprob"] for r in after] == [r["logprob"] for r in plain]
    assert model.model.layers[0].self_attn.config._attn_implementation == "sdpa"


def test_gold_attention_on_a_known_row():
    # 2 layers, 2 heads, 8 prompt tokens; records at tokens [1, 3), [3, 5), [5, 8)
    att = torch.zeros(2, 2, 8)
    att[0, 0, [0, 1, 5]] = torch.tensor([0.5, 0.1, 0.4])  # layer 0 head 0: record 2 most
    att[0, 1, [0, 3]] = torch.tensor([0.7, 0.3])  # head 1: record 1
    att[1, :, 1] = 1.0  # layer 1: both heads on record 0
    out = gold_attention(att, [(1, 3), (3, 5), (5, 8)], [1])
    assert out["attn_layers"]["gold_mass"] == [pytest.approx(0.15), 0.0]
    assert out["attn_layers"]["gold_rank"] == [2, 2]  # layer 0: record 2 (0.2) > gold (0.15); layer 1: record 0
    assert out["attn_layers"]["hit"] == [0.5, 0.0]
    assert out["attn_hit_rate"] == 0.25 and out["attn_gold_rank"] == 3  # averaged: record 0 0.525, 2 0.1, 1 0.075
    assert out["attn_gold_mass"] == pytest.approx(0.075)
    two = gold_attention(att, [(1, 3), (3, 5), (5, 8)], [1, 2])  # a block: the best of its records
    assert two["attn_layers"]["gold_rank"] == [1, 2]


def test_item_token_spans_cover_the_records():
    tok = make_tiny_tokenizer()
    for inst in kv(False) + kv(True):
        ids = encode(tok, inst, False).prompt_ids
        spans = item_token_spans(tok, inst, False)
        assert len(spans) == inst.num_items
        for (s, e), (a, b) in zip(spans, inst.meta["item_spans"]):
            text = tok.decode(ids[s:e])
            assert inst.prompt[a:b] in text and len(text) <= (b - a) + 4  # the record, at most a boundary more


def test_methods_that_compute_attention_themselves_are_refused():
    from posbias.methods import apply_method

    model = make_variant_model("llama")
    with apply_method(model, "ms-poe", r_min=1.2, r_max=1.8, skip_layers=0):
        with pytest.raises(ValueError, match="computes attention itself"):
            AttentionProbe(model)
    with AttentionProbe(model):
        with pytest.raises(ValueError, match="already active"):
            AttentionProbe(model)
    assert model.model.layers[0].self_attn.config._attn_implementation == "eager"
