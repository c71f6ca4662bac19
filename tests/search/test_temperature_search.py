"""The curve GA with ``--target temperature``: per-layer attention temperatures instead of RoPE factors."""
from __future__ import annotations

import json
import math

import pytest
from conftest import make_tiny_model, save_tiny_folder

from posbias.search.fitness import TeacherForcedFitness
from posbias.tasks.kv import make_kv


def test_fitness_applies_temperatures_not_rope_factors(tiny_tokenizer):
    from posbias.evaluation.teacher_forced import score_instances
    from posbias.methods import apply_method

    model = make_tiny_model("qwen3", layers=3)
    insts = make_kv(n=2, depths=[0.0, 0.5, 1.0], seed=0, split="search", num_keys=5, shared_context=True)
    values = [0.6, 1.0, 1.9]
    fit = TeacherForcedFitness(model, tiny_tokenizer, insts, batch_size=3, chat=False, target="temperature")
    res = fit.score(values)
    fit.close()
    with apply_method(model, "temperature", values=values) as h:
        rows = score_instances(h.model, tiny_tokenizer, fit.instances, batch_size=3, shared=True)
    from posbias.search.fitness import depth_key, empty_result

    ref = empty_result(fit.instances)
    for inst, r in zip(fit.instances, rows):
        ref.add(depth_key(inst.depth), r)
    assert math.isclose(res.logprob_sum, ref.logprob_sum, rel_tol=1e-5) and res.counts == ref.counts
    rope = TeacherForcedFitness(model, tiny_tokenizer, insts, batch_size=3, chat=False).score(values)
    assert not math.isclose(rope.logprob_sum, res.logprob_sum, rel_tol=1e-4)
    with pytest.raises(ValueError, match="search target"):
        TeacherForcedFitness(model, tiny_tokenizer, insts, target="alibi")


def test_search_target_temperature_cli(tmp_path):
    import typer
    from typer.testing import CliRunner

    from posbias.cli import lpes_cmd
    from posbias.methods.temperature import TEMPERATURE_GRID

    src = save_tiny_folder(tmp_path / "tiny", "qwen2", layers=4)
    app = typer.Typer()
    lpes_cmd.register(app)
    out = tmp_path / "search"
    args = ["search", "--model", str(src), "--task", "kv", "--num-keys", "4", "--out", str(out), "--target",
            "temperature", "--population", "3", "--n-per-depth", "1", "--batch-size", "2", "--generations", "2",
            "--heldout-n", "1"]
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 0, r.output
    cfg = json.loads((out / "config.json").read_text())["config"]
    assert cfg["target"] == "temperature" and tuple(cfg["ga"]["grid"]) == TEMPERATURE_GRID
    doc = json.loads((out / "best_factors.json").read_text())
    assert doc["target"] == "temperature" and len(doc["factors"]) == 4
    assert "| temperature |" in (out / "heldout" / "comparison.md").read_text()
    r = CliRunner().invoke(app, [*args[:9], "--target", "rope", "--population", "3", "--n-per-depth", "1",
                                 "--batch-size", "2", "--generations", "2", "--heldout-n", "0"])
    assert r.exit_code == 2 and "target" in r.output  # a temperature search folder is not resumed as LPES
