"""Positional hidden-state scaling: identity, the recomputed rows, the cache, generation, layouts."""
from __future__ import annotations

import pytest
import torch
from conftest import left_padded_batch, make_tiny_model, make_variant_model

from posbias.evaluation.scoring import prompt_dependent
from posbias.methods import apply_method
from posbias.methods.positional_hidden import HiddenScaleConfig, PositionalHiddenScaling, reference_band

LAYOUTS = ["llama", "qwen2-gqa7", "qwen3", "mistral", "gemma3"]


def _ids(t=14, b=2, seed=0):
    return torch.randint(3, 500, (b, t), generator=torch.Generator().manual_seed(seed))


def _logits(model, ids, **kw):
    with torch.no_grad():
        return model(input_ids=ids, use_cache=False, **kw).logits


@pytest.mark.parametrize("opts", [{"dims": [3], "factor": 1.0}, {"dims": []}, {"dims": [3], "layers": []}])
def test_identity_settings_install_nothing(opts):
    model = make_tiny_model("llama", layers=3)
    ids = _ids()
    ref = _logits(model, ids)
    with apply_method(model, "positional-hidden", **opts) as h:
        assert torch.equal(_logits(model, ids), ref)
        assert not h.state and h.shared_prefill
    assert not prompt_dependent(model)


@pytest.mark.parametrize("name", LAYOUTS)
@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_mechanics_with_factor_one_are_bit_identical(name, attn):
    """The hooks themselves (unscaled prefill rows, recomputed rows, value hook, cache) change nothing at factor 1."""
    model = make_variant_model(name)
    model.config._attn_implementation = attn
    ids, mask, pos = left_padded_batch(t=12)
    with torch.no_grad():
        ref = model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True)
        nxt = model(input_ids=ids[:, -1:], attention_mask=torch.cat([mask, mask[:, -1:]], 1),
                    position_ids=pos[:, -1:] + 1, cache=ref.past_key_values).logits
    n = len(model.model.layers)
    cfg = HiddenScaleConfig(dims=(1, 5), layers=tuple(range(n)), factor=1.0, last_recompute_tokens=2)
    state = PositionalHiddenScaling(model, cfg)
    try:
        with torch.no_grad():
            got = model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True)
            got_nxt = model(input_ids=ids[:, -1:], attention_mask=torch.cat([mask, mask[:, -1:]], 1),
                            position_ids=pos[:, -1:] + 1, cache=got.past_key_values).logits
    finally:
        state.remove()
    assert torch.equal(got.logits, ref.logits)
    assert torch.equal(got_nxt, nxt)


def _scale_everything(model, layer, dims, factor, change_value):
    """Reference for one layer: every token's attention input scaled (values per ``change_value``)."""
    attn = model.model.layers[layer].self_attn
    saved = {}

    def pre(module, args, kwargs):
        h = kwargs["hidden_states"]
        saved["h"] = h
        s = h.clone()
        s[..., dims] *= factor
        return args, {**kwargs, "hidden_states": s}

    def value(module, args, out):
        return out if change_value else module.forward(saved["h"])

    return [attn.register_forward_pre_hook(pre, with_kwargs=True), attn.v_proj.register_forward_hook(value)]


@pytest.mark.parametrize("change_value", [False, True])
@pytest.mark.parametrize("r", [1, 3])
def test_last_rows_recomputed_others_untouched(change_value, r):
    model = make_tiny_model("qwen2", layers=3, heads=4, kv_heads=2)
    ids = _ids(t=10)
    last = len(model.model.layers) - 1  # patch the last layer: its rows reach the logits directly
    plain = _logits(model, ids)
    hooks = _scale_everything(model, last, [2, 7], 0.0, change_value)
    scaled_all = _logits(model, ids)
    for h in hooks:
        h.remove()
    with apply_method(model, "positional-hidden", dims=[2, 7], layers=[last], factor=0.0,
                      last_recompute_tokens=r, change_value=change_value):
        got = _logits(model, ids)
    assert torch.equal(got[:, :-r], plain[:, :-r])
    torch.testing.assert_close(got[:, -r:], scaled_all[:, -r:], atol=1e-5, rtol=1e-5)
    assert (got[:, -r:] - plain[:, -r:]).abs().max() > 1e-4


@pytest.mark.parametrize("name", LAYOUTS)
def test_cache_answer_chunk_equals_token_by_token_and_no_cache_prefill(name):
    """Prefill with and without a cache agree; an answer fed through the cache at once equals feeding
    it one token at a time (every continuation token is recomputed, as in generation)."""
    model = make_variant_model(name)
    n = len(model.model.layers)
    prompt, answer = _ids(t=12, b=1), _ids(t=4, b=1, seed=1)
    with apply_method(model, "positional-hidden", dims=[1, 4], layers=list(range(1, n)), factor=-1.0) as h:
        assert prompt_dependent(model) and not h.shared_prefill
        with torch.no_grad():
            pre = model(input_ids=prompt, use_cache=True)
            torch.testing.assert_close(pre.logits, _logits(model, prompt), atol=0, rtol=0)
            chunk = model(input_ids=answer, cache=pre.past_key_values, use_cache=True).logits
            pre2 = model(input_ids=prompt, use_cache=True)
            cache, steps = pre2.past_key_values, []
            for j in range(answer.shape[1]):
                out = model(input_ids=answer[:, j:j + 1], cache=cache, use_cache=True)
                cache = out.past_key_values
                steps.append(out.logits)
    torch.testing.assert_close(chunk, torch.cat(steps, 1), atol=1e-5, rtol=1e-5)
    assert not prompt_dependent(model)


def test_generation_runs_and_matches_manual_decoding():
    model = make_tiny_model("llama", layers=3)
    prompt = _ids(t=9, b=1)
    with apply_method(model, "positional-hidden", dims=[0, 9], layers=[1, 2], factor=0.0):
        gen = model.generate(prompt, max_new_tokens=4, do_sample=False, pad_token_id=0)
        with torch.no_grad():
            out = model(input_ids=prompt, use_cache=True)
            toks, cache = [], out.past_key_values
            nxt = out.logits[:, -1:].argmax(-1)
            for _ in range(4):
                toks.append(nxt)
                out = model(input_ids=nxt, cache=cache, use_cache=True)
                cache, nxt = out.past_key_values, out.logits[:, -1:].argmax(-1)
    assert torch.equal(gen[:, prompt.shape[1]:], torch.cat(toks, 1))


def test_skip_first_counts_absolute_positions():
    model = make_tiny_model("llama", layers=2)
    ids = _ids(t=8, b=1)
    plain = _logits(model, ids)
    with apply_method(model, "positional-hidden", dims=[3], layers=[1], factor=0.0, skip_first=8):
        assert torch.equal(_logits(model, ids), plain)  # every position < 8: nothing scaled
    with apply_method(model, "positional-hidden", dims=[3], layers=[1], factor=0.0, skip_first=7):
        assert not torch.equal(_logits(model, ids), plain)


def model_of(n_layers):
    return make_tiny_model("llama", layers=n_layers)


def test_reference_band_and_bad_options():
    assert reference_band(32) == list(range(10, 26))
    assert reference_band(24) == list(range(8, 20))
    assert reference_band(2) == [1]
    with apply_method(model_of(12), "positional-hidden", dims=[1], band="0.5,1") as h:
        assert h.options["layers"] == list(range(6, 12))
    model = make_tiny_model("llama", layers=3)
    for opts, words in [({"dims": [32]}, "out of range"), ({"dims": [1], "factor": "x"}, "number"),
                        ({"dims": [1], "layers": [5]}, "out of range"),
                        ({"dims": [1], "last_recompute_tokens": 0}, "last_recompute_tokens"),
                        ({"dims": [1], "dims_file": "nowhere.json"}, "both"),
                        ({"dims_file": "nowhere.json"}, "does not exist"),
                        ({"dims": [1], "band": [0.5, 0.2]}, "band"),
                        ({"dims": [1], "band": [0.1, 0.5], "layers": [1]}, "not both")]:
        with pytest.raises(ValueError, match=words):
            apply_method(model, "positional-hidden", **opts)


def test_dims_file(tmp_path):
    import json

    f = tmp_path / "dims.json"
    f.write_text(json.dumps({"dims": [{"dim": 7, "smoothness": 0.1}, {"dim": 3, "smoothness": 0.2}]}))
    model = make_tiny_model("llama", layers=3)
    with apply_method(model, "positional-hidden", dims_file=str(f), dims_top=2) as h:
        assert h.options["dims"] == [3, 7]
    with pytest.raises(ValueError, match="lists 2"):
        apply_method(model, "positional-hidden", dims_file=str(f), dims_top=3)


def test_shared_context_scoring_falls_back_to_one_prompt_per_question(tiny_tokenizer):
    """Where the scaled rows are depends on where each prompt ends: a shared-context scorer prefills each
    prompt alone (same records as per-question scoring), and the answer goes through the cache."""
    from posbias.evaluation.teacher_forced import score_instances
    from posbias.tasks.kv import make_kv

    model = make_tiny_model("qwen2", layers=3)
    insts = make_kv(n=2, depths=[0.0, 1.0], seed=0, split="search", num_keys=5, shared_context=True)
    plain = score_instances(model, tiny_tokenizer, insts, batch_size=4, shared=True)
    with apply_method(model, "positional-hidden", dims=[4], layers=[1, 2], factor=0.0) as h:
        shared = score_instances(h.model, tiny_tokenizer, insts, batch_size=4, shared=True)
        alone = score_instances(h.model, tiny_tokenizer, insts, batch_size=1, shared=False)
    for a, b in zip(shared, alone):
        assert a["em"] == b["em"] and a["logprob"] == pytest.approx(b["logprob"], abs=1e-4)
    assert any(abs(a["logprob"] - p["logprob"]) > 1e-4 for a, p in zip(shared, plain))


def test_a_call_that_raised_leaves_nothing_behind():
    model = make_tiny_model("llama", layers=2)
    ids = _ids(t=10, b=1)
    with apply_method(model, "positional-hidden", dims=[3], layers=[1], factor=0.0) as h:
        ref = _logits(model, ids)
        boom = model.model.layers[1].self_attn.o_proj.register_forward_hook(lambda *a: 1 / 0)
        with pytest.raises(ZeroDivisionError):
            _logits(model, ids)
        boom.remove()
        assert torch.equal(_logits(model, ids), ref)
        with torch.no_grad():  # a decoding step after the failed prefill uses no stale tensor
            out = model(input_ids=ids[:, :6], use_cache=True)
            model(input_ids=ids[:, 6:7], cache=out.past_key_values, use_cache=True)
        assert not h.state["scaling"]._plain_out and not h.state["scaling"]._plain_in


def test_fused_projection_is_refused_in_one_line():
    model = make_variant_model("phi3")
    with pytest.raises(ValueError, match="no separate q_proj"):
        apply_method(model, "positional-hidden", dims=[1], factor=0.0)
    assert not model.model.layers[-1].self_attn._forward_pre_hooks
