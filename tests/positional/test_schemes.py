import math

import pytest
import torch

from posbias.positional import (
    SCHEMES,
    ALiBiBias,
    GGDBias,
    RotaryEmbedding,
    SinusoidalEmbedding,
    alibi_slopes,
    get_scheme,
)


def test_registry_names_and_kinds():
    assert {"rope", "sinusoidal", "nope", "alibi", "ggd", "kerple-log", "kerple-power", "fire"} <= set(SCHEMES)
    assert get_scheme("rope").kind == "rotary"
    assert get_scheme("sinusoidal").kind == "absolute"
    assert get_scheme("nope").kind == "none"
    assert get_scheme("alibi").kind == "bias" and get_scheme("ggd").kind == "bias"
    assert get_scheme("nope").build() is None


def test_unknown_scheme_lists_known():
    with pytest.raises(ValueError, match="known schemes: alibi, fire, ggd, kerple-log, kerple-power, nope, rope, "
                                         "sinusoidal"):
        get_scheme("xpos")


def test_alibi_slopes_power_of_two_and_other_counts():
    s8 = alibi_slopes(8)
    assert torch.allclose(s8, torch.tensor([2.0 ** (-(h + 1)) for h in range(8)]))
    s12 = alibi_slopes(12)  # 8 slopes of 8 heads, then every other slope of 16 heads
    s16 = alibi_slopes(16)
    assert torch.allclose(s12[:8], s8) and torch.allclose(s12[8:], s16[0::2][:4])
    assert len(alibi_slopes(5)) == 5


def test_alibi_bias_values_and_blocks():
    m = ALiBiBias(4)
    pos = torch.arange(6)
    full = m(pos, pos)
    assert full.shape == (4, 6, 6)
    assert full[0, 5, 2].item() == pytest.approx(-0.25 * 3)
    # a block of query positions (offset, as for a KV cache / chunk) equals the matching slice
    assert torch.equal(m(pos[3:5], pos), full[:, 3:5])


@pytest.mark.parametrize("beta", [-1.0, 0.0, 2.0])
def test_ggd_finite_values_and_gradients(beta):
    g = GGDBias(3, theta_alpha=0.5, theta_beta=beta)
    pos = torch.arange(64)
    b = g(pos, pos)
    assert torch.isfinite(b).all()
    z = torch.randn(3, 64, 64) + b
    z = z.masked_fill(torch.ones(64, 64, dtype=torch.bool).triu(1), float("-inf"))
    torch.softmax(z, -1).pow(2).sum().backward()
    assert torch.isfinite(g.theta_alpha.grad).all() and torch.isfinite(g.theta_beta.grad).all()
    assert g.theta_beta.grad.abs().sum() > 0 or beta == 0.0


def test_ggd_formula_and_special_cases():
    g = GGDBias(2, theta_alpha=[0.0, math.log(0.5)], theta_beta=[2.0, 1.0])
    b = g(torch.tensor([7]), torch.tensor([4]))  # |d| = 3
    assert b[0, 0, 0].item() == pytest.approx(-(3 + 1e-5) ** 2, rel=1e-5)
    assert b[1, 0, 0].item() == pytest.approx(-0.5 * 3, rel=1e-4)
    # nope init: constant bias (= uniform prior); alibi init reproduces ALiBi
    pos = torch.arange(10)
    nope = GGDBias(4, "nope")(pos, pos)
    assert torch.allclose(nope, torch.full_like(nope, -1.0))
    assert torch.allclose(GGDBias(4, "alibi")(pos, pos), ALiBiBias(4)(pos, pos), atol=1e-4)
    lin = GGDBias(5, "linear")
    assert torch.allclose(lin.theta_beta, torch.linspace(0, 1, 5))
    # extreme parameters stay finite (clamped magnitude)
    huge = GGDBias(1, theta_alpha=50.0, theta_beta=10.0)(pos, pos)
    assert torch.isfinite(huge).all()


def test_ggd_bad_init():
    with pytest.raises(ValueError, match="unknown GGD init"):
        GGDBias(2, "gauss")
    with pytest.raises(ValueError, match="expected 1 or 2"):
        GGDBias(2, theta_beta=[1.0, 2.0, 3.0])


def test_ggd_block_equals_slice():
    g = GGDBias(4, "linear")
    pos = torch.arange(20)
    assert torch.equal(g(pos[5:9], pos[:12]), g(pos, pos)[:, 5:9, :12])


def test_ggd_extra_parameter_count():
    layers, heads = 12, 16
    mods = torch.nn.ModuleList(GGDBias(heads) for _ in range(layers))
    assert sum(p.numel() for p in mods.parameters()) == 384


def test_rope_relative_and_matches_hf():
    torch.manual_seed(0)
    rope = RotaryEmbedding(8, theta=10000.0)
    q, k = torch.randn(1, 1, 1, 8), torch.randn(1, 1, 1, 8)
    s1 = (rope.apply(q, torch.tensor([5])) * rope.apply(k, torch.tensor([2]))).sum()
    s2 = (rope.apply(q, torch.tensor([13])) * rope.apply(k, torch.tensor([10]))).sum()
    assert s1.item() == pytest.approx(s2.item(), abs=1e-5)
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb
    x = torch.randn(1, 2, 4, 8)
    cos, sin = rope.cos_sin(torch.arange(4)[None])
    ref, _ = apply_rotary_pos_emb(x, x, cos, sin)
    assert torch.allclose(rope.apply(x, torch.arange(4)), ref, atol=1e-6)


def test_sinusoidal_shape_and_values():
    pe = SinusoidalEmbedding(6)(torch.arange(3))
    assert pe.shape == (3, 6)
    assert pe[0, 0].item() == 0.0 and pe[0, 1].item() == 1.0
    assert pe[2, 0].item() == pytest.approx(math.sin(2.0))


@pytest.mark.parametrize("cls", ["ggd", "alibi"])
def test_toeplitz_block_equals_forward(cls):
    m = GGDBias(4, theta_alpha=[-1.0, 0.0, 0.3, 1.0],
                theta_beta=[-1.0, 0.0, 1.0, 2.0]) if cls == "ggd" else ALiBiBias(4)
    for q0, nq, k0, nk in [(0, 7, 0, 7), (30, 5, 0, 35), (3, 4, 10, 6), (0, 1, 0, 1)]:
        ref = m(torch.arange(q0, q0 + nq), torch.arange(k0, k0 + nk))
        assert torch.equal(m.block(q0, nq, k0, nk), ref)
        # last query first: the same rows in reverse order, as a view of the offsets (no [h, i, j] copy)
        desc = m.block(q0, nq, k0, nk, descending_queries=True)
        assert torch.equal(desc, ref.flip(1)) and desc.untyped_storage().nbytes() == 4 * 4 * (nq + nk - 1)
