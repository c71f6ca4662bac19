"""Curve-constrained GA, memoised / pruned fitness, checkpoint + resume, workers."""
from __future__ import annotations

import functools
import json
from dataclasses import dataclass

import numpy as np
import pytest

from posbias.patching.rope_scaling import active_scaling
from posbias.search.evaluators import PoolEvaluator, SerialEvaluator
from posbias.search.fitness import FitnessResult, SyntheticFitness, TeacherForcedFitness, bump_objective
from posbias.search.ga import (
    GAConfig,
    Genome,
    crossover,
    genome_factors,
    genome_points,
    identity_genome,
    mutate,
    random_genome,
    repair_x,
)
from posbias.search.loop import run_ga

CFG = dict(population=6, elite=2, n_control=4)


def valid(g: Genome, cfg: GAConfig) -> bool:
    xs = list(g.x)
    return (len(xs) == cfg.n_control - 2 and all(1 <= i < cfg.x_resolution for i in xs)
            and all(b > a for a, b in zip(xs, xs[1:])) and len(g.y) == cfg.n_control
            and all(0 <= j < len(cfg.grid) for j in g.y))


def test_repair_x_makes_strictly_increasing_interior():
    rng = np.random.default_rng(0)
    for _ in range(500):
        n = int(rng.integers(0, 6))
        res = int(rng.integers(n + 2, 30))
        xs = rng.integers(-5, res + 5, size=n)
        r = repair_x(xs, res)
        assert len(r) == n and all(1 <= i <= res - 1 for i in r) and all(b > a for a, b in zip(r, r[1:]))
    assert repair_x([3, 3, 3], 20) == (3, 4, 5)
    assert repair_x([19, 19], 20) == (18, 19)


def test_operators_keep_genomes_valid_and_bounded():
    cfg = GAConfig(**CFG, max_y_step=2, max_x_step=3, mutation_rate=0.9)
    rng = np.random.default_rng(1)
    for _ in range(300):
        a, b = random_genome(rng, cfg), random_genome(rng, cfg)
        assert valid(a, cfg) and valid(b, cfg)
        m = mutate(a, rng, cfg)
        assert valid(m, cfg)
        assert all(abs(p - q) <= 2 for p, q in zip(m.y, a.y))
        c = crossover(a, b, rng, cfg)
        assert valid(c, cfg)
        assert all(cy in (ay, by) for cy, ay, by in zip(c.y, a.y, b.y))
        assert mutate(a, rng, GAConfig(**CFG, mutation_rate=0.0), force=True) != a
    pts = genome_points(identity_genome(cfg), cfg)
    assert [p[1] for p in pts] == [1.0] * 4 and pts[0][0] == 0.0 and pts[-1][0] == 1.0
    assert genome_factors(identity_genome(cfg), cfg, 30).tolist() == [1.0] * 30  # exactly: layers untouched
    assert hash(Genome((1, 2), (3, 4, 5, 6))) == hash(Genome((1, 2), (3, 4, 5, 6)))


def test_config_validation():
    with pytest.raises(ValueError, match="elite"):
        GAConfig(population=4, elite=4)
    with pytest.raises(ValueError, match="x_resolution"):
        GAConfig(n_control=6, x_resolution=5)
    with pytest.raises(ValueError, match="unknown curve"):
        GAConfig(curve="spline")


class CountingFitness(SyntheticFitness):
    def __init__(self):
        super().__init__(bump_objective)
        self.calls: list[tuple] = []

    def score(self, factors, **kw):
        self.calls.append(tuple(factors))
        return super().score(factors, **kw)


def _strip(history):
    return [{k: v for k, v in h.items() if k not in ("wall_s", "scoring_s")} for h in history]


def test_same_seed_same_search_and_improves():
    cfg = GAConfig(**CFG)
    runs = [run_ga(SerialEvaluator(SyntheticFitness(bump_objective)), cfg, num_layers=12, generations=6, seed=7)
            for _ in range(2)]
    assert _strip(runs[0].history) == _strip(runs[1].history)
    other = run_ga(SerialEvaluator(SyntheticFitness(bump_objective)), cfg, num_layers=12, generations=6, seed=8)
    assert _strip(other.history) != _strip(runs[0].history)
    best = [h["best_accuracy"] for h in runs[0].history]
    assert best == sorted(best)  # elitism: never worse
    assert best[-1] > bump_objective([1.0] * 12)  # beats the identity (in the initial population)


def test_resume_equals_uninterrupted_and_never_rescores(tmp_path):
    cfg = GAConfig(**CFG)
    full_fit = CountingFitness()
    full = run_ga(SerialEvaluator(full_fit), cfg, num_layers=12, generations=6, seed=3, out=tmp_path / "a")
    fit1, fit2 = CountingFitness(), CountingFitness()
    run_ga(SerialEvaluator(fit1), cfg, num_layers=12, generations=3, seed=3, out=tmp_path / "b")
    # simulate a kill after generation 4 was logged but before it was checkpointed
    from posbias.utils.io import append_jsonl

    append_jsonl(tmp_path / "b" / "metrics.jsonl", {"generation": 3, "torn": True})
    with pytest.raises(ValueError, match="resume"):
        run_ga(SerialEvaluator(fit2), cfg, num_layers=12, generations=6, seed=3, out=tmp_path / "b")
    resumed = run_ga(SerialEvaluator(fit2), cfg, num_layers=12, generations=6, seed=3, out=tmp_path / "b",
                     resume=True)
    assert resumed.best == full.best and resumed.best_factors == full.best_factors
    assert _strip(resumed.history) == _strip(full.history)
    a = json.loads((tmp_path / "a" / "checkpoint.json").read_text())
    b = json.loads((tmp_path / "b" / "checkpoint.json").read_text())
    assert a["ga"] == b["ga"] and [m[0] for m in a["memo"]] == [m[0] for m in b["memo"]]
    lines = [json.loads(x) for x in (tmp_path / "b" / "metrics.jsonl").read_text().splitlines()]
    assert [m["generation"] for m in lines] == list(range(6))
    # memoisation: every distinct genome scored exactly once, also across the resume
    calls = fit1.calls + fit2.calls
    assert len(calls) == len(set(calls)) == len(full_fit.calls)
    assert sum(h["memo_hits"] for h in full.history) >= 2 * 5  # the elite is never rescored
    # a resume with other GA settings is refused
    with pytest.raises(ValueError, match="other GA settings"):
        run_ga(SerialEvaluator(fit2), GAConfig(**{**CFG, "population": 7}), num_layers=12, generations=7,
               seed=3, out=tmp_path / "b", resume=True)


class CrashingFitness(CountingFitness):
    """Dies (like a kill) in the middle of a generation after ``limit`` evaluations."""

    def __init__(self, limit):
        super().__init__()
        self.limit = limit

    def score(self, factors, **kw):
        if len(self.calls) >= self.limit:
            raise KeyboardInterrupt("killed")
        return super().score(factors, **kw)


def test_crash_mid_generation_then_resume_equals_uninterrupted(tmp_path):
    cfg = GAConfig(**CFG)
    full = run_ga(SerialEvaluator(SyntheticFitness(bump_objective)), cfg, num_layers=10, generations=5, seed=11)
    with pytest.raises(KeyboardInterrupt):
        run_ga(SerialEvaluator(CrashingFitness(limit=13)), cfg, num_layers=10, generations=5, seed=11,
               out=tmp_path)
    done = json.loads((tmp_path / "checkpoint.json").read_text())["ga"]["generation"]
    assert 0 < done < 5
    resumed = run_ga(SerialEvaluator(SyntheticFitness(bump_objective)), cfg, num_layers=10, generations=5,
                     seed=11, out=tmp_path, resume=True)
    assert _strip(resumed.history) == _strip(full.history) and resumed.best == full.best


def test_pool_workers_match_serial():
    cfg = GAConfig(**CFG)
    serial = run_ga(SerialEvaluator(SyntheticFitness(bump_objective)), cfg, num_layers=12, generations=3, seed=5)
    pool = PoolEvaluator(functools.partial(SyntheticFitness, bump_objective), workers=2)
    try:
        par = run_ga(pool, cfg, num_layers=12, generations=3, seed=5)
    finally:
        pool.close()
    assert _strip(par.history) == _strip(serial.history)


def test_ray_actors_match_serial():
    """Ray actors (the cross-node backend) give the serial search's result."""
    ray = pytest.importorskip("ray")
    from posbias.search.evaluators import RayEvaluator

    cfg = GAConfig(**CFG)
    serial = run_ga(SerialEvaluator(SyntheticFitness(bump_objective)), cfg, num_layers=12, generations=2, seed=5)
    ray.init(num_cpus=2, log_to_driver=False, include_dashboard=False)
    try:
        ev = RayEvaluator(functools.partial(SyntheticFitness, bump_objective), workers=2)
        par = run_ga(ev, cfg, num_layers=12, generations=2, seed=5)
        ev.close()
    finally:
        ray.shutdown()
    assert _strip(par.history) == _strip(serial.history)


# -- teacher-forced fitness with a stubbed scorer -------------------------------------------------

@dataclass
class FakeInst:
    id: str
    depth: float


def fake_scorer(model, tokenizer, instances, *, batch_size=8, chat=False, progress=False):
    """em depends on the active factors: gold at the end is found iff the last layer's factor < 1,
    at the beginning always, in the middle iff the middle factor is 1; log-prob = -mean factor."""
    h = active_scaling(model)
    f = h.factors if h is not None else (1.0,) * 3
    fake_scorer.calls += len(instances)
    out = []
    for inst in instances:
        idx = int(inst.id.split("-")[1])
        em = {0.0: True, 0.5: f[1] == 1.0 and idx % 2 == 0, 1.0: f[-1] < 1.0}[inst.depth]
        out.append({"id": inst.id, "em": em, "logprob": -2.0 * sum(f) / len(f), "n_tokens": 2})
    return out


fake_scorer.calls = 0


@pytest.fixture
def stub_fitness(monkeypatch):
    from conftest import make_tiny_model

    import posbias.evaluation.teacher_forced as tf

    monkeypatch.setattr(tf, "score_teacher_forced", fake_scorer)
    fake_scorer.calls = 0
    insts = [FakeInst(f"{d}-{i}", d) for d in (0.0, 0.5, 1.0) for i in range(6)]
    return TeacherForcedFitness(make_tiny_model("llama"), None, insts, batch_size=2, chunk_size=3)


def test_fitness_accuracy_weights_and_tiebreak(stub_fitness):
    r = stub_fitness.score([1.0, 1.0, 0.9])
    assert r.complete and r.n_scored == 18
    assert r.per_depth_accuracy() == {"0": 1.0, "0.5": 0.5, "1": 1.0}
    assert r.accuracy == pytest.approx((1 + 0.5 + 1) / 3)
    assert r.mean_logprob == pytest.approx(-2.0 * 2.9 / 3 / 2)
    w = TeacherForcedFitness(stub_fitness.model, None, stub_fitness.instances, weights=[0, 0, 1])
    assert w.score([1.0, 1.0, 1.0]).accuracy == 0.0
    # tie on accuracy broken by log-prob
    a, b = stub_fitness.score([1.0, 1.0, 0.9]), stub_fitness.score([1.0, 1.0, 0.8])
    assert a.accuracy == b.accuracy and b.key > a.key


def test_pruning_stops_early_and_continues_exactly(stub_fitness):
    full = stub_fitness.score([1.0, 1.3, 1.0])  # acc = (1 + 0 + 0) / 3
    calls = fake_scorer.calls
    pruned = stub_fitness.score([1.0, 1.3, 1.0], threshold=0.8)
    assert pruned.pruned and not pruned.complete and pruned.n_scored < 18
    assert pruned.upper_bound < 0.8 and pruned.accuracy <= full.accuracy <= pruned.upper_bound
    assert fake_scorer.calls - calls == pruned.n_scored
    cont = stub_fitness.score([1.0, 1.3, 1.0], partial=pruned)
    assert cont.complete and cont.key == full.key and cont.counts == full.counts
    assert fake_scorer.calls - calls == 18  # nothing scored twice
    # a threshold equal to the reachable accuracy never prunes (ties are kept)
    assert stub_fitness.score([1.0, 1.3, 1.0], threshold=full.accuracy).complete


def test_pruned_search_keeps_each_generations_elite(stub_fitness):
    cfg = GAConfig(population=6, elite=2, n_control=3, grid=(0.8, 0.9, 1.0, 1.1, 1.3), init_y_spread=2,
                   curve="step")
    fake_scorer.calls = 0
    pruned = run_ga(SerialEvaluator(stub_fitness), cfg, num_layers=3, generations=4, seed=0, prune=True)
    n_pruned = fake_scorer.calls
    assert sum(h["pruned"] for h in pruned.history) > 0
    for h in pruned.history:
        genomes = [Genome.from_list(i["genome"]) for i in h["individuals"]]
        full = {g: stub_fitness.score(genome_factors(g, cfg, 3)).key for g in genomes}
        exact_top = sorted(genomes, key=lambda g: full[g], reverse=True)[:2]
        assert [full[g] for g in genomes[:2]] == [full[g] for g in exact_top]  # the elite is exact
        for i, g in zip(h["individuals"], genomes):
            assert i["accuracy"] <= full[g][0]  # pruned: lower bound
    # pruned individuals were not scored to the end
    assert n_pruned < 18 * sum(h["scored"] for h in pruned.history)
    # each generation reports the objective's best / mean and the questions it scored
    for h in pruned.history:
        assert h["objective"] == "accuracy" and h["best_value"] == h["best_accuracy"]
        assert h["mean_value"] == pytest.approx(sum(i["value"] for i in h["individuals"]) / h["unique"])
    assert sum(h["questions_scored"] for h in pruned.history) == n_pruned


def test_fitness_result_roundtrip():
    r = FitnessResult({"0": [1, 2, 3]}, {"0": 1.0}, logprob_sum=-1.5, n_scored=2, n_total=3, pruned=True)
    assert FitnessResult.from_dict(json.loads(json.dumps(r.to_dict()))) == r


# -- end to end on a tiny model: run_search through the CLI, resume, apply, analyze ---------------

def test_search_apply_analyze_cli_on_tiny_model(tmp_path, tiny_tokenizer, saved_figures):
    import typer
    from conftest import make_tiny_model
    from typer.testing import CliRunner

    from posbias.cli import lpes_cmd
    from posbias.models import load_model

    src = tmp_path / "tiny"
    make_tiny_model("qwen3", layers=4).save_pretrained(src)
    tiny_tokenizer.save_pretrained(src)
    app = typer.Typer()
    lpes_cmd.register(app)
    runner = CliRunner()
    out = tmp_path / "search"
    args = ["search", "--model", str(src), "--task", "kv", "--num-keys", "4", "--out", str(out),
            "--population", "3", "--n-per-depth", "2", "--batch-size", "2", "--curve", "linear"]
    r = runner.invoke(app, args + ["--generations", "2", "--heldout-n", "1"])
    assert r.exit_code == 0, r.output
    assert "gen  1" in r.output
    assert "winner chosen by log-prob (accuracy breaks ties); its search-split accuracy" in text_of(r)
    table = (out / "heldout" / "comparison.md").read_text()
    assert "| none |" in table and "| lpes |" in table and (out / "heldout" / "comparison.png").exists()
    args += ["--heldout-n", "0"]
    for name in ("config.json", "checkpoint.json", "metrics.jsonl", "best_factors.json", "factors.png", "fitness.png"):
        assert (out / name).exists(), name
    metrics = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    # 3 individuals x 2 shared contexts x (one prefill + one batch of its 3 questions)
    assert len(metrics) == 2 and metrics[0]["forward_passes"] == 3 * 2 * 2
    assert metrics[1]["memo_hits"] >= 2
    r = runner.invoke(app, args + ["--generations", "3"])  # re-running resumes
    assert r.exit_code == 0, r.output
    assert len((out / "metrics.jsonl").read_text().splitlines()) == 3
    r = runner.invoke(app, args + ["--generations", "3", "--seed", "1"])
    assert r.exit_code == 2 and "other settings" in r.output
    doc = json.loads((out / "best_factors.json").read_text())
    assert doc["num_layers"] == 4 and doc["curve"]["type"] == "linear" and doc["task"] == "kv"
    assert doc["below_unpatched"] == (doc["score"] < doc["unpatched_accuracy"])  # the search summary says it

    patched = tmp_path / "patched"
    r = runner.invoke(app, ["apply", "--model", str(src), "--factors", str(out / "best_factors.json"),
                            "--out", str(patched)])
    assert r.exit_code == 0, r.output
    m, _ = load_model(str(patched))
    assert list(active_scaling(m).factors) == pytest.approx(doc["factors"])

    r = runner.invoke(app, ["analyze", "--model", str(src), "--factors", str(out / "best_factors.json"),
                            "--task", "kv", "--num-keys", "4", "--n", "1", "--controls", "2",
                            "--out", str(tmp_path / "an")])
    assert r.exit_code == 0, r.output
    res = json.loads((tmp_path / "an" / "analysis.json").read_text())
    assert set(res["variants"]) == {"found", "noisy0", "noisy1", "shuffled0", "shuffled1"}
    assert all(len(v["deviation"]) == 4 for v in res["variants"].values())
    found = saved_figures["analysis.png"].axes[0].lines[0]  # the found factors' curve, drawn first
    assert list(found.get_ydata()) == pytest.approx(res["variants"]["found"]["deviation"])
    final = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    best = saved_figures["fitness.png"].axes[0].lines[0].get_ydata()  # the last search's plot: 3 generations
    assert list(best) == pytest.approx([m["best_value"] for m in final])
    assert list(saved_figures["factors.png"].axes[0].lines[0].get_ydata()) == pytest.approx(doc["factors"])


def test_linear_cka_properties():
    import torch

    from posbias.search.analysis import linear_cka

    g = torch.Generator().manual_seed(0)
    x = torch.randn(50, 8, generator=g)
    q, _ = torch.linalg.qr(torch.randn(8, 8, generator=g))
    assert linear_cka(x, x) == pytest.approx(1.0)
    assert linear_cka(x, 3 * x @ q + 1) == pytest.approx(1.0)  # invariant to rotation, scale, shift
    assert linear_cka(x, torch.randn(50, 8, generator=g)) < 0.5


def text_of(res) -> str:
    """CLI output with rich's line wrapping undone."""
    return " ".join(res.output.split())


def test_on_a_tie_the_factors_nearest_identity_win():
    """A model on which every genome scores the same: the search returns the unpatched model's factors
    (in the initial population), not whichever genome sorted first."""
    res = run_ga(SerialEvaluator(SyntheticFitness(lambda f: 0.0)), GAConfig(**CFG), num_layers=8, generations=2, seed=1)
    assert res.best_factors == [1.0] * 8


def test_a_resumed_search_says_how_far_it_was(tmp_path, capsys):
    cfg = GAConfig(**CFG)
    run_ga(SerialEvaluator(SyntheticFitness(bump_objective)), cfg, num_layers=6, generations=2, seed=0, out=tmp_path)
    assert "resuming" not in capsys.readouterr().err
    run_ga(SerialEvaluator(SyntheticFitness(bump_objective)), cfg, num_layers=6, generations=3, seed=0, out=tmp_path,
           resume=True)
    assert f"resuming 2 of 3 generations already in {tmp_path}" in capsys.readouterr().err


def test_a_winner_below_the_unpatched_model_is_said_in_one_line(tmp_path, monkeypatch):
    """A log-prob winner can answer fewer search-split questions than the model without it: say so."""
    import typer
    from typer.testing import CliRunner

    from posbias.cli import lpes_cmd
    from posbias.search import runner as search_runner

    def fake(cfg, **kw):
        return search_runner.SearchResult(out=tmp_path, factors_path=tmp_path / "best_factors.json", factors=[1.0],
                                          control_points=[], curve="bezier", accuracy=0.0, per_depth={},
                                          baseline_accuracy=1 / 3, generations=1, history=[], objective="logprob")

    monkeypatch.setattr(search_runner, "run_search", fake)
    monkeypatch.setattr(search_runner, "check_search_model", lambda cfg: None)
    app = typer.Typer()
    lpes_cmd.register(app)
    r = CliRunner().invoke(app, ["search", "--model", "smollm2-135m", "--task", "kv", "--out", str(tmp_path / "s"),
                                 "--heldout-n", "0"])
    assert r.exit_code == 0, r.output
    text = " ".join(r.output.split())
    assert "warning: the winner answers fewer search-split questions than the unpatched model (0.000 < 0.333)" in text
    assert not search_runner.SearchResult(out=tmp_path, factors_path=tmp_path, factors=[1.0], control_points=[],
                                          curve="bezier", accuracy=0.5, per_depth={}, baseline_accuracy=0.5,
                                          generations=1, history=[]).below_unpatched
