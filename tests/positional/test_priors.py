"""KERPLE (log, power) and FIRE priors: formulas, initialisation, constraints, blocks."""
import math

import pytest
import torch

from posbias.positional import FIREBias, KerpleLogBias, KerplePowerBias, get_scheme, project_parameters
from posbias.positional.kerple import EPS


def test_registered_as_bias_schemes():
    for name, cls in (("kerple-log", KerpleLogBias), ("kerple-power", KerplePowerBias), ("fire", FIREBias)):
        spec = get_scheme(name)
        assert spec.kind == "bias" and isinstance(spec.build(num_heads=3), cls)
    fire = get_scheme("fire").build(num_heads=2, fire_hidden=5, fire_threshold=64.0)
    assert fire.w2.shape == (2, 5) and fire.threshold == 64.0


def test_kerple_formulas():
    pos_q, pos_k = torch.tensor([7]), torch.tensor([4])  # d = 3
    log = KerpleLogBias(2, r1=[0.5, 2.0], r2=[1.0, 0.1])
    assert log(pos_q, pos_k)[:, 0, 0].tolist() == pytest.approx([-0.5 * math.log(4.0), -2.0 * math.log(1.3)])
    power = KerplePowerBias(2, r1=[0.5, 0.2], r2=[1.0, 1.5])
    assert power(pos_q, pos_k)[:, 0, 0].tolist() == pytest.approx([-1.5, -0.2 * 3 ** 1.5])
    # r2 = 1 is ALiBi with learnable slopes; the bias is 0 at distance 0
    pos = torch.arange(6)
    assert torch.allclose(KerplePowerBias(1, r1=0.25, r2=1.0)(pos, pos)[0],
                          -0.25 * (pos[:, None] - pos[None]).abs().float())
    assert torch.equal(power(pos, pos)[:, 2, 2], torch.zeros(2))


@pytest.mark.parametrize("cls,r1_range,r2_range", [(KerpleLogBias, (0, 2), (0, 1)), (KerplePowerBias, (0, 1), (0, 2))])
def test_kerple_initialisation_is_the_references(cls, r1_range, r2_range):
    torch.manual_seed(0)
    m = cls(4096)
    for p, (lo, hi) in ((m.r1, r1_range), (m.r2, r2_range)):
        assert p.min().item() == pytest.approx(max(p.min().item(), lo + EPS)) and p.max().item() <= hi
        assert p.mean().item() == pytest.approx((lo + hi) / 2, abs=0.05)  # uniform draws
    assert not torch.equal(cls(4).r1, cls(4).r1)  # drawn, not fixed


def test_kerple_constraints_are_clamped_and_projected():
    power = KerplePowerBias(3, r1=[0.5, 0.5, 0.5], r2=[1.0, 1.0, 1.0])
    with torch.no_grad():
        power.r1.copy_(torch.tensor([-1.0, 0.005, 0.3]))
        power.r2.copy_(torch.tensor([3.0, -0.5, 0.7]))
    r1, r2 = power.constrained()  # what the forward pass uses
    assert r1.tolist() == pytest.approx([EPS, EPS, 0.3]) and r2.tolist() == pytest.approx([2.0, EPS, 0.7])
    project_parameters(torch.nn.ModuleList([power]))
    assert power.r1.tolist() == pytest.approx([EPS, EPS, 0.3]) and power.r2.tolist() == pytest.approx([2.0, EPS, 0.7])
    log = KerpleLogBias(1, r1=0.5, r2=0.5)
    with torch.no_grad():
        log.r2.fill_(10.0)  # no upper bound on the log kernel's r2
    log.project_()
    assert log.r2.item() == 10.0


@pytest.mark.parametrize("cls", [KerpleLogBias, KerplePowerBias])
def test_kerple_gradients_are_finite_at_distance_zero(cls):
    m = cls(2, r1=[0.5, 1.0], r2=[0.5, 1.5])
    pos = torch.arange(16)
    m(pos, pos).tril().sum().backward()
    assert torch.isfinite(m.r1.grad).all() and torch.isfinite(m.r2.grad).all() and m.r2.grad.abs().sum() > 0


@pytest.mark.parametrize("cls", [KerpleLogBias, KerplePowerBias])
def test_kerple_toeplitz_block_equals_forward(cls):
    m = cls(3, r1=[0.2, 1.0, 1.8], r2=[0.3, 0.9, 1.7])
    for q0, nq, k0, nk in [(0, 7, 0, 7), (30, 5, 0, 35), (3, 4, 10, 6)]:
        ref = m(torch.arange(q0, q0 + nq), torch.arange(k0, k0 + nk))
        assert torch.allclose(m.block(q0, nq, k0, nk), ref, atol=1e-6)
        assert torch.allclose(m.block(q0, nq, k0, nk, descending_queries=True), ref.flip(1), atol=1e-6)


def test_fire_initialisation_is_the_papers():
    torch.manual_seed(0)
    f = FIREBias(4)
    assert f.hidden == 32 and f.c().item() == pytest.approx(0.1) and f.threshold_value().item() == 512.0
    assert f.w1.abs().max() <= 1 and f.b1.abs().max() <= 1  # nn.Linear(1, 32): U(-1, 1)
    bound = 1 / math.sqrt(32)
    assert f.w2.abs().max() <= bound and f.b2.abs().max() <= bound and f.w2.std() > bound / 3
    with pytest.raises(ValueError, match="threshold and c must be positive"):
        FIREBias(4, threshold=0)


def test_fire_normalised_distance_and_threshold():
    f = FIREBias(2, c=0.5, threshold=10.0)
    pos = torch.arange(40)
    u = f.normalised_distance(pos, pos)
    causal = torch.ones(40, 40, dtype=torch.bool).tril()
    assert u[causal].min() == 0 and u[causal].max() < 1
    # below the threshold every query shares the normaliser psi(L): the bias depends on the distance only
    assert u[5, 2].item() == pytest.approx(math.log(1 + 0.5 * 3) / (math.log(1 + 0.5 * 10) + 1e-6))
    assert u[5, 2] == u[8, 5]
    # beyond it the query's own position normalises: the same distance counts less further on
    assert u[30, 27].item() == pytest.approx(math.log(1 + 0.5 * 3) / (math.log(1 + 0.5 * 30) + 1e-6))
    assert u[30, 27] < u[20, 17]
    # a 2-D q_index gives one normaliser per batch row
    idx = torch.stack([pos, pos + 100])
    ub = f.normalised_distance(pos, pos, idx)
    assert ub.shape == (2, 40, 40) and torch.equal(ub[0], u) and (ub[1][causal] <= u[causal]).all()
    assert f(pos, pos, idx).shape == (2, 2, 40, 40)


def test_fire_piecewise_form_equals_the_mlp_values_and_gradients():
    torch.manual_seed(1)
    f = FIREBias(3, hidden=16, threshold=20.0)
    with torch.no_grad():  # a unit that never switches (w1 = 0) and one exactly at a knot
        f.w1[3], f.b1[3] = 0.0, 0.4
        f.w1[4], f.b1[4] = 0.0, -0.2
    pos = torch.arange(50)
    u = f.normalised_distance(pos, pos)
    a, b = f(pos, pos), f.mlp(u)
    assert torch.allclose(a, b, atol=1e-5)
    a.pow(2).sum().backward()
    piecewise = {n: p.grad.clone() for n, p in f.named_parameters()}
    f.zero_grad()
    f.mlp(f.normalised_distance(pos, pos)).pow(2).sum().backward()
    for n, p in f.named_parameters():
        assert torch.allclose(piecewise[n], p.grad, rtol=1e-4, atol=1e-3), n
        assert p.grad.abs().sum() > 0, n


def test_fire_query_blocks_equal_the_rows_of_the_full_bias():
    f = FIREBias(4, threshold=8.0)
    pos = torch.arange(30)
    full = f(pos, pos)
    assert torch.equal(f(pos[10:17], pos[:17]), full[:, 10:17, :17])
    assert f.score_fn()(torch.tensor(2), torch.tensor(5.0), torch.tensor(20)).item() == \
        pytest.approx(full[2, 20, 15].item(), abs=1e-5)
