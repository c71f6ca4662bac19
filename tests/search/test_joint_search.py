"""LPES factors and attention temperatures searched together: two curves in one genome
(``--target rope+temperature``), their operators, their fitness, their file and the ``lpes`` method."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from conftest import make_tiny_model, make_variant_model, save_tiny_folder

from posbias.methods import apply_method
from posbias.methods.temperature import TEMPERATURE_GRID, TemperatureHooks
from posbias.patching.curves import DEFAULT_GRID
from posbias.patching.rope_scaling import apply_layer_scaling, save_factors_file
from posbias.search.evaluators import SerialEvaluator
from posbias.search.fitness import SyntheticFitness, apply_values
from posbias.search.ga import (
    GAConfig,
    GeneticAlgorithm,
    Genome,
    crossover,
    genome_factors,
    genome_points,
    identity_genome,
    join_genomes,
    mutate,
    random_genome,
    split_genome,
)
from posbias.search.loop import run_ga

JOINT = GAConfig(population=6, elite=2, n_control=4, extra_grids=(TEMPERATURE_GRID,))


def _valid_curve(g: Genome, cfg: GAConfig) -> bool:
    xs = list(g.x)
    return (len(xs) == cfg.n_control - 2 and all(1 <= i < cfg.x_resolution for i in xs)
            and all(b > a for a, b in zip(xs, xs[1:])) and len(g.y) == cfg.n_control
            and all(0 <= j < len(cfg.grid) for j in g.y))


def _valid(g: Genome, cfg: GAConfig) -> bool:
    return all(_valid_curve(p, cfg.curve_config(k)) for k, p in enumerate(split_genome(g, cfg)))


def test_one_curve_searches_are_unchanged():
    """A one-curve GA takes the code path it always took: the seed-0 population after three generations
    is the one recorded before joint genomes existed, and its settings record no new key (so run
    folders written before resume)."""
    cfg = GAConfig(population=6, elite=2, n_control=4)
    ga = GeneticAlgorithm(cfg, np.random.default_rng(0))
    for _ in range(3):
        ga.tell({g: -i for i, g in enumerate(ga.ask())})
    assert [g.to_list() for g in ga.population] == [
        [[7, 13], [7, 7, 7, 7]], [[13, 16], [5, 6, 4, 4]], [[12, 13], [5, 5, 7, 7]],
        [[7, 13], [7, 7, 5, 4]], [[11, 17], [5, 3, 6, 4]], [[13, 14], [3, 6, 4, 3]]]
    assert "extra_grids" not in cfg.to_dict() and GAConfig(**cfg.to_dict()) == cfg
    assert GAConfig(**JOINT.to_dict()) == JOINT and JOINT.to_dict()["extra_grids"] == [list(TEMPERATURE_GRID)]


def test_joint_operators_keep_each_curve_valid():
    rng = np.random.default_rng(0)
    ident = identity_genome(JOINT)
    assert len(ident.x) == 2 * 2 and len(ident.y) == 2 * 4
    assert genome_factors(ident, JOINT, 6).tolist() == [1.0] * 12  # the unpatched model
    points = genome_points(ident, JOINT)
    assert len(points) == 2 and all(len(p) == 4 for p in points)
    pop = [random_genome(rng, JOINT) for _ in range(30)]
    for _ in range(300):
        a, b = pop[rng.integers(len(pop))], pop[rng.integers(len(pop))]
        child = mutate(crossover(a, b, rng, JOINT), rng, JOINT)
        forced = mutate(child, rng, JOINT, force=True)
        assert _valid(child, JOINT) and _valid(forced, JOINT) and forced != child
        assert join_genomes(split_genome(child, JOINT)) == child
        values = genome_factors(child, JOINT, 6)
        assert values.shape == (12,)
        assert min(values[:6]) >= DEFAULT_GRID[0] - 1e-9 and max(values[:6]) <= DEFAULT_GRID[-1] + 1e-9
        assert min(values[6:]) >= TEMPERATURE_GRID[0] - 1e-9 and max(values[6:]) <= TEMPERATURE_GRID[-1] + 1e-9
    # crossover takes each curve's control points from either parent, never a mix inside a point
    a, b = pop[0], pop[1]
    for _ in range(20):
        child = crossover(a, b, rng, JOINT)
        for pa, pb, pc in zip(*(split_genome(g, JOINT) for g in (a, b, child))):
            assert all(y in (ya, yb) for y, ya, yb in zip(pc.y, pa.y, pb.y))


def _two_targets(values):
    """Highest with the RoPE curve at 0.8 and the temperature curve at 1.3 (one per half)."""
    n = len(values) // 2
    return -sum((f - 0.8) ** 2 for f in values[:n]) - sum((t - 1.3) ** 2 for t in values[n:])


def test_joint_search_is_seeded_resumes_exactly_and_moves_both_curves(tmp_path):
    def run(**kw):
        return run_ga(SerialEvaluator(SyntheticFitness(_two_targets)), JOINT, num_layers=6, seed=5, **kw)

    full = run(generations=8)
    assert run(generations=8).best_factors == full.best_factors
    run(generations=3, out=tmp_path / "b")
    resumed = run(generations=8, out=tmp_path / "b", resume=True)
    assert resumed.best == full.best and resumed.best_factors == full.best_factors
    best = full.best_factors
    assert len(best) == 12 and _two_targets(best) > _two_targets([1.0] * 12)
    assert np.mean(best[:6]) < 1.0 and np.mean(best[6:]) > 1.0  # each curve went its own way
    with pytest.raises(ValueError, match="other GA settings"):  # a one-curve search does not resume it
        run_ga(SerialEvaluator(SyntheticFitness(_two_targets)), GAConfig(population=6, elite=2), num_layers=6,
               seed=5, generations=9, out=tmp_path / "b", resume=True)


def _logits(model, ids):
    with torch.no_grad():
        return model(ids).logits


@pytest.mark.parametrize("name", ["llama", "qwen2-gqa7", "gemma3"])
def test_joint_values_are_rope_factors_then_temperatures(name):
    model = make_variant_model(name)
    n = model.config.num_hidden_layers
    ids = torch.randint(0, model.config.vocab_size, (1, 40), generator=torch.Generator().manual_seed(0))
    plain = _logits(model, ids)
    with apply_values(model, "rope+temperature", [1.0] * (2 * n)):
        assert torch.equal(_logits(model, ids), plain)  # identity: bit-identical
    factors, temps = np.linspace(1.0, 0.6, n).tolist(), np.linspace(1.3, 0.7, n).tolist()
    with apply_layer_scaling(model, factors), TemperatureHooks(model, temps):
        both = _logits(model, ids)
    with apply_values(model, "rope+temperature", factors + temps):
        assert torch.equal(_logits(model, ids), both)
    for target, values in (("rope", factors), ("temperature", temps)):
        with apply_values(model, target, values):
            assert not torch.allclose(_logits(model, ids), both)  # neither half alone
    assert torch.equal(_logits(model, ids), plain)  # removed on exit


def _joint_file(path, factors, temps):
    line = {"type": "linear", "control_points": [[0, factors[0]], [1, factors[-1]]]}
    tline = {"type": "linear", "control_points": [[0, temps[0]], [1, temps[-1]]]}
    save_factors_file(path, factors=factors, curve=line, target="rope+temperature", temperatures=temps,
                      temperature_curve=tline)


def test_lpes_applies_both_halves_of_a_joint_file(tmp_path):
    model = make_tiny_model("llama", layers=3)
    ids = torch.randint(0, model.config.vocab_size, (1, 30), generator=torch.Generator().manual_seed(1))
    f = tmp_path / "joint.json"
    _joint_file(f, [1.0, 0.9, 0.8], [1.4, 1.2, 1.0])
    with apply_values(model, "rope+temperature", [1.0, 0.9, 0.8, 1.4, 1.2, 1.0]):
        ref = _logits(model, ids)
    with apply_method(model, "lpes", factors=str(f)) as h:
        assert torch.equal(_logits(model, ids), ref) and h.options == {"factors": str(f)}
    deep = make_tiny_model("llama", layers=5)
    with apply_method(deep, "lpes", factors=str(f)) as h:  # both curves re-evaluated for 5 layers
        assert h.state["temperatures"] == pytest.approx((1.4, 1.3, 1.2, 1.1, 1.0))
    with pytest.raises(ValueError, match="lpes@factors"):
        apply_method(model, "temperature", values_file=str(f))
    bad = tmp_path / "bad.json"
    save_factors_file(bad, factors=[1.0] * 3, target="rope+temperature", temperatures=[1.0, -1.0, 1.0])
    with pytest.raises(ValueError, match="> 0"):
        apply_method(model, "lpes", factors=str(bad))


def test_apply_merge_refuses_a_joint_file(tmp_path):
    from posbias.models.export import check_apply_request

    f = tmp_path / "joint.json"
    _joint_file(f, [1.0, 0.9, 0.8], [1.4, 1.2, 1.0])
    assert check_apply_request("lpes", {"factors": str(f)}, merge=False) == "lpes"
    with pytest.raises(ValueError, match="temperatures of a joint search"):
        check_apply_request("lpes", {"factors": str(f)}, merge=True)


def test_search_target_rope_plus_temperature_cli(tmp_path, saved_figures):
    import typer
    from typer.testing import CliRunner

    from posbias.cli import lpes_cmd

    src = save_tiny_folder(tmp_path / "tiny", "qwen2", layers=4)
    app = typer.Typer()
    lpes_cmd.register(app)
    out = tmp_path / "search"
    args = ["search", "--model", str(src), "--task", "kv", "--num-keys", "4", "--out", str(out), "--target",
            "rope+temperature", "--population", "3", "--n-per-depth", "1", "--batch-size", "2",
            "--generations", "2", "--heldout-n", "1"]
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 0, r.output
    assert "temperatures: " in r.output
    cfg = json.loads((out / "config.json").read_text())["config"]
    assert cfg["ga"]["extra_grids"] == [list(TEMPERATURE_GRID)] and tuple(cfg["ga"]["grid"]) == DEFAULT_GRID
    doc = json.loads((out / "best_factors.json").read_text())
    assert doc["target"] == "rope+temperature" and len(doc["factors"]) == 4 and len(doc["temperatures"]) == 4
    assert len(doc["curve"]["control_points"]) == 4 and len(doc["temperature_curve"]["control_points"]) == 4
    assert (out / "factors.png").exists() and (out / "temperatures.png").exists()
    drawn = saved_figures["temperatures.png"].axes[0]
    assert list(drawn.lines[0].get_ydata()) == pytest.approx(doc["temperatures"])
    assert drawn.get_ylabel() == "attention temperature t_l"
    assert "| lpes |" in (out / "heldout" / "comparison.md").read_text()
    run = json.loads((out / "heldout" / "lpes" / "config.json").read_text())["config"]
    assert run["method_options"] == {"factors": str(out / "best_factors.json")}  # both halves, through lpes
    joint = str(out / "best_factors.json")
    r = CliRunner().invoke(app, ["analyze", "--model", str(src), "--factors", joint, "--task", "kv", "--num-keys",
                                 "4", "--n", "1", "--out", str(tmp_path / "an")])
    assert r.exit_code == 2 and "holds rope+temperature values" in r.output and not (tmp_path / "an").exists()
    r = CliRunner().invoke(app, ["apply", "--model", str(src), "--factors", joint, "--merge",
                                 "--out", str(tmp_path / "merged")])
    assert r.exit_code == 2 and "joint search" in r.output and not (tmp_path / "merged").exists()
