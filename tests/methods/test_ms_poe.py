"""Ms-PoE: the head -> ratio mapping (incl. grouped-query attention) and the position-awareness order."""
from __future__ import annotations

import pytest
import torch
from conftest import make_tiny_model

from posbias.methods import apply_method
from posbias.methods.ms_poe import position_awareness, ratio_grid, ratios_from_scores


def _attn_heads(model, layer, **inputs):
    """Per-head attention output of ``layer`` (input of o_proj), shape (B, T, H, d)."""
    attn = model.model.layers[layer].self_attn
    got = {}
    hook = attn.o_proj.register_forward_pre_hook(lambda m, a: got.__setitem__("x", a[0].detach().clone()))
    try:
        model(**inputs)
    finally:
        hook.remove()
    x = got["x"]
    return x.view(*x.shape[:2], model.config.num_attention_heads, -1)


def _global_factor(model, factor):
    """Reference: HF's own RoPE with every position divided by ``factor`` (whole model)."""
    rot = model.model.rotary_emb
    saved = rot.inv_freq.clone()
    rot.inv_freq.copy_(saved / factor)
    return saved


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_gqa_head_ratio_equals_global_factor_for_that_head(arch):
    # 4 query heads share 2 key heads: heads 0,1 read key head 0; heads 2,3 read key head 1.
    # Heads sharing a key head get different ratios, so keys must be rotated per query head.
    model = make_tiny_model(arch, heads=4, kv_heads=2, layers=2, seed=5)
    ratios = [1.3, 1.0, 2.0, 1.7]
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, 500, (2, 24), generator=g)
    mask = torch.ones_like(ids)
    mask[1, :5] = 0
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    inputs = dict(input_ids=ids, attention_mask=mask, position_ids=pos)
    with apply_method(model, "ms-poe", ratios=ratios, layers=[0]):
        patched = _attn_heads(model, 0, **inputs)
    valid = mask.bool()
    for h, r in enumerate(ratios):
        saved = _global_factor(model, r)
        try:
            ref = _attn_heads(model, 0, **inputs)
        finally:
            model.model.rotary_emb.inv_freq.copy_(saved)
        torch.testing.assert_close(patched[:, :, h][valid], ref[:, :, h][valid], atol=1e-5, rtol=1e-5)
    # sanity: the two heads sharing key head 0 really differ from the unscaled model where r != 1
    plain = _attn_heads(model, 0, **inputs)
    assert (patched[:, :, 0] - plain[:, :, 0])[valid].abs().max() > 1e-4
    torch.testing.assert_close(patched[:, :, 1][valid], plain[:, :, 1][valid], atol=1e-5, rtol=1e-5)


def test_unpatched_layers_are_untouched():
    model = make_tiny_model("llama", layers=3)
    ids = torch.randint(3, 500, (1, 20))
    plain = [_attn_heads(model, i, input_ids=ids) for i in range(2)]
    with apply_method(model, "ms-poe"):  # default: skip the first 2 layers
        for i in range(2):
            torch.testing.assert_close(_attn_heads(model, i, input_ids=ids), plain[i], atol=0, rtol=0)


def test_ratio_grid_and_score_order():
    grid = ratio_grid(4, 1.2, 1.8)
    torch.testing.assert_close(grid, torch.tensor([1.2, 1.35, 1.5, 1.65]))
    scores = torch.tensor([[0.1, 0.5, 0.3, 0.2], [0.4, 0.3, 0.2, 0.1]])
    r = ratios_from_scores(scores, grid)
    # most position-aware head gets the smallest ratio
    torch.testing.assert_close(r, torch.tensor([[1.65, 1.2, 1.35, 1.5], [1.2, 1.35, 1.5, 1.65]]))


def test_position_awareness_score():
    # head 0 attends to one key only (sharp), head 1 uniformly
    d = 4
    k = torch.zeros(1, 2, 10, d)
    k[0, 0, 3, 0] = 20.0
    q = torch.zeros(1, 2, 1, d)
    q[0, 0, 0, 0] = 1.0
    s = position_awareness(q, k, None, scaling=1.0)
    assert s[0, 0] == pytest.approx(0.1) and s[0, 1] == 0.0
    # padding keys do not count
    mask = torch.zeros(1, 1, 1, 10)
    mask[..., :5] = torch.finfo(torch.float32).min
    s = position_awareness(q, k, mask, scaling=1.0)
    assert s[0, 0] == pytest.approx(0.0) and s[0, 1] == 0.0


def test_score_order_is_a_per_row_permutation_and_consistent_with_fixed_ratios():
    model = make_tiny_model("llama", layers=3, seed=2)
    ids = torch.randint(3, 500, (2, 30))
    mask = torch.ones_like(ids)
    mask[0, :7] = 0
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    with apply_method(model, "ms-poe", skip_layers=2) as h:
        out = h.model(input_ids=ids, attention_mask=mask, position_ids=pos).logits
        state = h.state["ms_poe"]
        r = state.head_ratios(2)
        grid = ratio_grid(4, 1.2, 1.8)
        for row in r:
            torch.testing.assert_close(row.sort().values, grid)
    # row 1 alone, with its ratios fixed, reproduces the batched logits
    with apply_method(model, "ms-poe", skip_layers=2, ratios=r[1].tolist()) as h:
        alone = h.model(input_ids=ids[1:], attention_mask=mask[1:], position_ids=pos[1:]).logits
    torch.testing.assert_close(alone[0], out[1], atol=1e-5, rtol=1e-5)


def test_score_order_ratios_kept_during_cached_decoding():
    model = make_tiny_model("llama", layers=3, seed=2)
    ids = torch.randint(3, 500, (1, 25))
    with apply_method(model, "ms-poe", skip_layers=0) as h:
        out = h.model(input_ids=ids, use_cache=True)
        before = {i: h.state["ms_poe"].head_ratios(i).clone() for i in range(3)}
        nxt = out.logits[:, -1:].argmax(-1)
        h.model(input_ids=nxt, past_key_values=out.past_key_values, use_cache=True)
        for i in range(3):
            assert torch.equal(h.state["ms_poe"].head_ratios(i), before[i])


def test_rank_and_reference_permutation_mappings():
    """The reference code indexes the ratios by the argsort of the scores; the rank mapping gives the
    most position-aware head the smallest ratio (values checked by hand, H = 4, 1.2 .. 1.8)."""
    scores = torch.tensor([0.05, 0.30, 0.10, 0.20])
    grid = ratio_grid(4, 1.2, 1.8)
    torch.testing.assert_close(ratios_from_scores(scores, grid, "rank"), torch.tensor([1.65, 1.2, 1.5, 1.35]))
    torch.testing.assert_close(ratios_from_scores(scores, grid, "permutation"), torch.tensor([1.35, 1.65, 1.5, 1.2]))


def test_score_rope_choice_and_bad_choices_are_refused(monkeypatch):
    """``unrotated`` scores the raw q / k (the reference code), ``rotated`` the RoPE'd ones."""
    import posbias.methods.ms_poe as M

    model = make_tiny_model("llama", layers=3, seed=2)
    ids = torch.randint(3, 500, (1, 40), generator=torch.Generator().manual_seed(3))
    seen = {}
    real = M.position_awareness

    def spy(q_last, k, *a, **kw):
        seen.setdefault(choice, (q_last.clone(), k.clone()))
        return real(q_last, k, *a, **kw)

    monkeypatch.setattr(M, "position_awareness", spy)
    for choice in ("unrotated", "rotated"):
        with apply_method(model, "ms-poe", skip_layers=0, score_rope=choice) as h, torch.no_grad():
            h.model(input_ids=ids)
            assert h.options["score_rope"] == choice and h.options["mapping"] == "rank"
    (qu, ku), (qr, kr) = seen["unrotated"], seen["rotated"]
    assert qu.shape == qr.shape and not torch.allclose(qu, qr) and not torch.allclose(ku, kr)
    assert torch.allclose(ku[..., 0, :], kr[..., 0, :])  # position 0: RoPE is the identity
    with pytest.raises(ValueError, match="mapping must be one of rank, permutation"):
        apply_method(model, "ms-poe", mapping="sorted")
    with pytest.raises(ValueError, match="score_rope"):
        apply_method(model, "ms-poe", score_rope="both")


def _decode(model, ids, steps=5, cache=None):
    """Greedy steps from a prefill of ``ids`` (B, T): the stacked last-position logits (steps + 1, B, V)."""
    out = model(input_ids=ids, use_cache=True)
    cache, logits = out.past_key_values, [out.logits[:, -1]]
    nxt = out.logits[:, -1:].argmax(-1)
    for _ in range(steps):
        out = model(input_ids=nxt, past_key_values=cache, use_cache=True)
        logits.append(out.logits[:, -1])
        nxt = out.logits[:, -1:].argmax(-1)
    return torch.stack(logits)


@pytest.mark.parametrize("method,opts", [("ms-poe", {"skip_layers": 0}), ("ms-poe", {"order": "index"}),
                                         ("moice", {"seed": 3})])
def test_rotated_key_cache_equals_re_rotating_the_whole_cache(method, opts):
    """Decoding with the rotated keys kept between steps gives the very logits of re-rotating every step."""
    import warnings

    model = make_tiny_model("qwen3", heads=4, kv_heads=2, layers=3, seed=1)
    ids = torch.randint(3, 500, (2, 30), generator=torch.Generator().manual_seed(0))
    got = {}
    for kept in (True, False):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            h = apply_method(model, method, rotated_cache=kept, **opts)
        with h:
            got[kept] = _decode(model, ids)
            state = h.state["ms_poe" if method == "ms-poe" else "moice"]
            if kept:
                assert state.rotated.reused >= 5  # every decoding step reused the earlier rotated keys
            else:
                assert state.rotated is None
    assert torch.equal(got[True], got[False])


def test_rotated_key_cache_is_not_reused_for_another_or_cropped_cache():
    """Prefill A, prefill B, then decode A: A's steps must not reuse B's rotated keys (same length,
    same last token); a cropped cache extended again is rotated afresh."""
    model = make_tiny_model("llama", layers=2, seed=4)
    g = torch.Generator().manual_seed(1)
    a, b = torch.randint(3, 500, (1, 20), generator=g), torch.randint(3, 500, (1, 20), generator=g)
    b[:, -1] = a[:, -1]  # layer 0's last keys of A and B are equal
    nxt = torch.tensor([[7]])
    with apply_method(model, "ms-poe", order="index", skip_layers=0):
        ca = model(input_ids=a, use_cache=True).past_key_values
        model(input_ids=b, use_cache=True)
        interleaved = model(input_ids=nxt, past_key_values=ca, use_cache=True).logits
        cache = model(input_ids=a, use_cache=True).past_key_values
        model(input_ids=torch.tensor([[9, 10, 11]]), past_key_values=cache, use_cache=True)
        cache.crop(-3)  # back to the 20 prompt tokens
        cropped = model(input_ids=torch.tensor([[12, 13, 14]]), past_key_values=cache, use_cache=True).logits
    with apply_method(model, "ms-poe", order="index", skip_layers=0, rotated_cache=False):
        ca = model(input_ids=a, use_cache=True).past_key_values
        alone = model(input_ids=nxt, past_key_values=ca, use_cache=True).logits
        cache = model(input_ids=a, use_cache=True).past_key_values
        fresh = model(input_ids=torch.tensor([[12, 13, 14]]), past_key_values=cache, use_cache=True).logits
    torch.testing.assert_close(interleaved, alone, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(cropped, fresh, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("method,opts", [("moice", {"seed": 3}), ("ms-poe", {"order": "index", "skip_layers": 0})])
def test_rotated_key_cache_is_not_reused_after_a_beam_reorder(method, opts):
    """Beam search reorders the rows of the very cache object and keeps its length: rows ending in the
    same token (equal last keys at layer 0) must still be rotated afresh, not given another row's keys."""
    import warnings

    model = make_tiny_model("llama", layers=2, seed=4)
    ids = torch.randint(3, 500, (2, 12), generator=torch.Generator().manual_seed(1))
    ids[1, -1] = ids[0, -1]  # same last token, different history
    got, reused = {}, {}
    for kept in (True, False):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            h = apply_method(model, method, rotated_cache=kept, **opts)
        with h:
            cache = model(input_ids=ids, use_cache=True).past_key_values
            cache.reorder_cache(torch.tensor([1, 0]))
            got[kept] = model(input_ids=torch.tensor([[7], [7]]), past_key_values=cache, use_cache=True).logits
            state = h.state["ms_poe" if method == "ms-poe" else "moice"]
            reused[kept] = state.rotated.reused if kept else None
    assert reused[True] == 0 and torch.equal(got[True], got[False])


def test_rotated_keys_are_freed_with_their_cache():
    import gc

    model = make_tiny_model("llama", layers=2, seed=4)
    ids = torch.randint(3, 500, (1, 12), generator=torch.Generator().manual_seed(2))
    with apply_method(model, "ms-poe", order="index", skip_layers=0) as h:
        store = h.state["ms_poe"].rotated
        cache = model(input_ids=ids, use_cache=True).past_key_values
        model(input_ids=torch.tensor([[7]]), past_key_values=cache, use_cache=True)
        assert len(store._store) == 2  # one slot per patched layer
        del cache
        gc.collect()
        assert not store._store and not store._owners


def test_rotated_cache_option_must_be_a_bool():
    model = make_tiny_model("llama", layers=2, seed=4)
    with pytest.raises(ValueError, match="rotated_cache must be true or false"):
        apply_method(model, "ms-poe", rotated_cache="yes")


@pytest.mark.parametrize("options, message", [
    ({"threshold": float("nan")}, "threshold must be a finite number"),
    ({"threshold": -1}, "threshold must be >= 0"),
    ({"r_max": float("inf")}, "r_max must be a finite number"),
    ({"r_min": "1" + "0" * 400}, "r_min must be a finite number"),
    ({"r_min": 0}, "r_min must be > 0"),
])
def test_ms_poe_refuses_settings_outside_their_range(options, message):
    from conftest import make_tiny_model

    from posbias.methods import apply_method

    with pytest.raises(ValueError, match=message):
        apply_method(make_tiny_model("llama"), "ms-poe", **options)
