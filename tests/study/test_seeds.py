"""Study folders side by side (posbias study-seeds): one row per scheme and seed, settings compared."""
import json

import pytest
from typer.testing import CliRunner

from posbias.cli.main import app
from posbias.study.grid import PASSKEY_FILE
from posbias.utils.run_folder import open_run


def cli(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


def _study(path, seed, results, **settings):
    """A study folder with ``results = {scheme: {length: [tf_em, ...]}}`` in its passkey jsonl."""
    open_run(path, "study", {"seed": seed, "train_context": 256, "train_steps": 4000, **settings}).commit()
    (path / "models.json").write_text(json.dumps({m: f"models/{m}/final" for m in results}))
    lines = [json.dumps({"model": m, "length": L, "depth": 0.5, "tf_em": em})
             for m, by in results.items() for L, ems in by.items() for em in ems]
    (path / PASSKEY_FILE).write_text("\n".join(lines) + "\n")
    return path


def test_rows_per_scheme_and_seed_with_intervals_and_a_plot(tmp_path):
    a = _study(tmp_path / "s0", 0, {"ggd": {256: [1, 1], 512: [1, 0]}, "rope": {256: [0, 0]}})
    b = _study(tmp_path / "s1", 1, {"ggd": {256: [1, 1], 512: [1, 1]}})
    res = cli("study-seeds", a, b, "--out", tmp_path / "cmp" / "seeds.md")
    assert res.exit_code == 0, res.output
    text = (tmp_path / "cmp" / "seeds.md").read_text()
    overview, tables = text.split("## passkey, accuracy", 1)
    assert "| passkey: ggd (s0/s1) | 100/100 | 50/100 |" in overview  # every folder of a scheme in one cell
    assert "| passkey: rope (s0) | 0 | · |" in overview  # rope: not scored at 512
    rows = [line for line in tables.splitlines() if line.startswith("| ") and "scheme" not in line]
    assert [r.split("|")[1].strip() for r in rows] == ["ggd (seed 0)", "ggd (seed 1)", "rope (seed 0)"]
    assert rows[0].startswith("| ggd (seed 0) | 100 [34, 100] | 50 [9, 91] |")  # Wilson, n = 2
    assert rows[2].endswith("| 0 [0, 66] |  |")  # rope: not scored at 512
    assert "differ only in the seed" in text and (tmp_path / "cmp" / "seeds_passkey.png").stat().st_size > 0
    assert "seeds_probes.png" not in text  # no trainer probes in these folders: no probe figure


def test_schemes_option_keeps_only_those_schemes_and_names_an_unknown_one(tmp_path):
    a = _study(tmp_path / "s0", 0, {"ggd": {256: [1, 1]}, "rope": {256: [0, 0]}})
    b = _study(tmp_path / "c0", 0, {"ggd": {256: [1, 0]}})  # the same seed: rows labelled by folder name
    res = cli("study-seeds", a, b, "--out", tmp_path / "cmp.md", "--schemes", "ggd")
    assert res.exit_code == 0, res.output
    text = (tmp_path / "cmp.md").read_text()
    assert "| passkey: ggd (s0/c0) | 100/50 |" in text and "rope" not in text
    res = cli("study-seeds", a, b, "--out", tmp_path / "cmp2.md", "--schemes", "ggd,alibi")
    assert res.exit_code != 0 and "--schemes alibi: in none of the folders (they hold ggd,rope)" in res.output
    assert not (tmp_path / "cmp2.md").exists()


def test_probe_curves_of_every_folder_in_one_figure(tmp_path):
    a = _study(tmp_path / "s0", 0, {"ggd": {256: [1]}})
    b = _study(tmp_path / "s1", 1, {"ggd": {256: [0]}})
    for folder, em in ((a, 1.0), (b, 0.0)):
        (folder / "models" / "ggd").mkdir(parents=True)
        (folder / "models" / "ggd" / "metrics.jsonl").write_text(
            json.dumps({"step": 100, "loss": 1.0}) + "\n" + json.dumps({"step": 100, "passkey_em": em,
                                                                        "passkey_logprob": -1.0}) + "\n")
    text = cli("study-seeds", a, b, "--out", tmp_path / "seeds.md")
    assert text.exit_code == 0, text.output
    assert "![probes during training](seeds_probes.png)" in (tmp_path / "seeds.md").read_text()
    assert (tmp_path / "seeds_probes.png").stat().st_size > 0


def test_other_differences_are_listed_and_unequal_contexts_refused(tmp_path):
    from posbias.study.seeds import compare_studies

    a = _study(tmp_path / "s0", 0, {"ggd": {256: [1]}})
    b = _study(tmp_path / "cap", 0, {"ggd": {256: [0]}})
    c = _study(tmp_path / "long", 1, {"ggd": {256: [1]}})
    json_c = json.loads((c / "config.json").read_text())
    json_c["config"]["train_steps"] = 8000
    (c / "config.json").write_text(json.dumps(json_c))
    text = compare_studies([a, b, c], tmp_path / "x.md")
    assert "ggd (s0)" in text and "ggd (cap)" in text and "ggd (seed 1)" in text  # a shared seed: folder names
    assert "seed 1 vs s0: train_steps: 4000 -> 8000" in text
    e = _study(tmp_path / "fresh", 3, {"ggd": {256: [1]}}, needle_draw="per-depth")  # a (s0) has no needle_draw: shared
    assert "seed 3 vs seed 0: needle_draw: 'shared' -> 'per-depth'" in compare_studies([a, e], tmp_path / "w.md")
    f = _study(tmp_path / "base", 4, {"ggd": {256: [1]}}, model_options={"rope_theta": 1e4})  # a has no such setting
    assert "seed 4 vs seed 0: model_options.rope_theta: None -> 10000.0" in compare_studies([a, f], tmp_path / "v.md")
    d = tmp_path / "ctx"
    open_run(d, "study", {"seed": 2, "train_context": 128}).commit()
    with pytest.raises(ValueError, match="different contexts"):
        compare_studies([a, d], tmp_path / "y.md")
    refused = cli("study-seeds", a, tmp_path / "nothing", "--out", tmp_path / "z.md")
    assert refused.exit_code == 2 and "is not a study folder" in refused.output
    assert cli("study-seeds", a, "--out", tmp_path / "z.md").exit_code == 2


def test_a_trained_model_setting_that_no_study_setting_records_is_listed(tmp_path):
    from posbias.study.seeds import compare_studies

    def with_model(path, seed, **saved):
        study = _study(path, seed, {"sinusoidal": {256: [1]}}, model_options=saved.pop("model_options", {}))
        final = path / "models" / "sinusoidal" / "final"
        final.mkdir(parents=True)
        (final / "config.json").write_text(json.dumps({"pe": "sinusoidal", "attn_backend": saved.pop("backend", "auto"),
                                                       **saved}))
        return study

    old = with_model(tmp_path / "old", 0)  # saved before embed_init_std existed: its default, None
    new = with_model(tmp_path / "new", 1, embed_init_std=0.088, backend="chunked")  # the backend: how it runs
    text = compare_studies([old, new], tmp_path / "a.md")
    assert "seed 1 vs seed 0: sinusoidal model embed_init_std: None -> 0.088" in text
    assert "attn_backend" not in text and "differ only in the seed" not in text
    base = with_model(tmp_path / "base", 2, rope_theta=1e4, model_options={"rope_theta": 1e4})
    text = compare_studies([old, base], tmp_path / "b.md")  # a --model-opt is listed once, as a study setting
    assert text.count("rope_theta") == 1 and "model_options.rope_theta: None -> 10000.0" in text
