"""Many positional-hidden settings from one plain prefill equal each setting scored on its own."""
import pytest
import torch
from conftest import make_variant_model

from posbias.evaluation.hidden_sweep import score_hidden_settings
from posbias.evaluation.teacher_forced import score_instances
from posbias.methods import apply_method
from posbias.tasks.base import Instance

PROMPTS = ["The grass is green. The sky is blue. The sun is yellow. Here we go. The pass key is",
           "Here we go. There and back again. The grass is green. What is the pass key? It is",
           "The sun is yellow. Question: who wrote the document? The grass is green. Answer:"]
SETTINGS = [
    {"dims": [3, 7, 11], "factor": -4.0, "layers": [0, 1, 2]},
    {"dims": [1, 5, 9], "factor": 4.0, "band": [0.3, 1.0]},
    {"dims": [3], "factor": 1.0},  # identity
    {"dims": [2, 6, 10], "factor": -3.0, "last_recompute_tokens": 2, "skip_first": 2, "layers": [0, 2]},
    {"dims": [4, 8], "factor": 0.0, "change_value": True, "layers": [0, 1]},
]


def _instances():
    return [Instance(id=f"t{i}", task="toy", prompt=p, answers=[" 4213"], gold_index=0, num_items=1, depth=0.0,
                     metric="substring") for i, p in enumerate(PROMPTS)]


def _alone(model, tok, insts, options):
    with apply_method(model, "positional-hidden", **options) as h:
        return score_instances(h.model, tok, insts, batch_size=1, shared=h.shared_prefill)


def _same(got, want):
    assert [r["id"] for r in got] == [r["id"] for r in want]
    assert [r["em"] for r in got] == [r["em"] for r in want]
    assert [r["prompt_tokens"] for r in got] == [r["prompt_tokens"] for r in want]
    for g, w in zip(got, want):
        assert g["logprob"] == pytest.approx(w["logprob"], abs=2e-5)


@pytest.mark.parametrize("name", ["llama", "qwen2-gqa7", "gemma3"])
@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_sweep_equals_each_setting_alone(name, attn, tiny_tokenizer):
    model = make_variant_model(name)
    model.config._attn_implementation = attn
    insts = _instances()
    plain, rows = score_hidden_settings(model, tiny_tokenizer, insts, SETTINGS)
    _same(plain, score_instances(model, tiny_tokenizer, insts, batch_size=1))
    for options, got in zip(SETTINGS, rows):
        _same(got, _alone(model, tiny_tokenizer, insts, options))
    assert rows[2] == plain  # the identity setting is the plain model
    for k in (0, 1, 3, 4):  # every other setting moves the scores 10x beyond the tolerance
        assert max(abs(a["logprob"] - b["logprob"]) for a, b in zip(plain, rows[k])) > 2e-4


def test_the_settings_change_the_scores_and_leave_no_hook(tiny_tokenizer):
    model = make_variant_model("llama")
    insts = _instances()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    plain, rows = score_hidden_settings(model, tiny_tokenizer, insts, SETTINGS[:1])
    assert any(abs(a["logprob"] - b["logprob"]) > 2e-4 for a, b in zip(plain, rows[0]))
    attn = model.model.layers[1].self_attn
    assert not attn._forward_pre_hooks and not attn._forward_hooks and not attn.v_proj._forward_hooks
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_progress_callback_and_bad_settings(tiny_tokenizer):
    model = make_variant_model("llama")
    seen = []
    score_hidden_settings(model, tiny_tokenizer, _instances()[:2], [{"dims": [3]}], on_instance=seen.append)
    assert seen == [1, 2]
    with pytest.raises(ValueError, match="dims"):
        score_hidden_settings(model, tiny_tokenizer, _instances(), [{"dims": [10_000]}])
