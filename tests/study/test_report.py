"""The study report's training table: the 1x probe and whether a probe target was reached."""
import json
import re

from posbias.study.report import probe_history, trainer_logs, training_table


def _model(out, name, metrics, probe_target=0.0, finished=True):
    folder = out / "models" / name
    folder.mkdir(parents=True)
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in metrics))
    (folder / "config.json").write_text(json.dumps({"kind": "train", "config": {"probe_target": probe_target}}))
    if finished:  # the trainer's final model (a Hugging Face config)
        (folder / "final").mkdir()
        (folder / "final" / "config.json").write_text(json.dumps({"model_type": "bam"}))


def test_training_table_says_where_each_scheme_reached_its_probe_target(tmp_path):
    loss = [{"step": s, "loss": 2.0 - s / 10, "tokens": s * 1000, "elapsed_s": 6 * s} for s in (1, 2, 3)]
    _model(tmp_path, "ggd", loss + [{"step": 3, "passkey_em": 1.0, "passkey_logprob": -0.1},
                                    {"step": 3, "stopped_by": "probe_target", "probe_target": 0.95, "tokens": 3000}],
           0.95)
    _model(tmp_path, "rope", loss + [{"step": 3, "passkey_em": 0.25, "passkey_logprob": -8.0}], 0.95)
    _model(tmp_path, "alibi", loss + [{"step": 3, "passkey_em": 0.5, "passkey_logprob": -4.0}])
    _model(tmp_path, "sinusoidal", loss + [{"step": 3, "passkey_em": 0.75, "passkey_logprob": -1.0},
                                           {"step": 3, "stopped_by": "final_step", "tokens": 3000}], 0.95)
    _model(tmp_path, "rope_ssmax", loss[:2] + [{"step": 2, "stopped_by": "final_step", "tokens": 2000}] + loss[2:]
           + [{"step": 3, "passkey_em": 0.5, "passkey_logprob": -2.0}])  # resumed past its first final_step
    _model(tmp_path, "nope", loss + [{"step": 3, "passkey_em": 0.0, "passkey_logprob": -9.0}], 0.95, finished=False)
    _model(tmp_path, "ggd_ssmax", loss + [{"step": 3, "passkey_em": 1.0, "passkey_logprob": -0.2, "niah_em": 0.5,
                                           "niah_logprob": -3.0}])
    logs = trainer_logs(tmp_path, ["ggd", "rope", "alibi", "nope", "ggd+ssmax", "sinusoidal", "rope+ssmax"])
    table = training_table(tmp_path, logs).splitlines()
    row = {line.split("|")[1].strip(): line for line in table if line.startswith("| ") and "scheme" not in line}
    assert "100% (-0.1), target 95% reached at step 3 (0.00M tokens)" in row["ggd"]
    assert "25% (-8.0), target 95% not reached" in row["rope"]
    assert row["alibi"].endswith("50% (-4.0) |")
    assert "75% (-1.0), ended at step 3 (0.00M tokens) by final_step |" in row["sinusoidal"]  # cut on purpose
    assert row["rope+ssmax"].endswith("50% (-2.0) |")
    assert "0% (-9.0), still training |" in row["nope"]  # a report written mid-training says so
    assert row["ggd+ssmax"].endswith("100% (-0.2), NIAH 50% (-3.0) |")  # NIAH probed too


def test_failing_needles_name_the_needles_that_fail_where_a_scheme_mostly_succeeds():
    from posbias.study.report import failing_needles

    def rec(model, length, answer, right):
        return {"model": model, "length": length, "depth": 0.5, "answers": [answer], "tf_em": right}

    recs = ([rec("ggd", 256, a, a != "44") for a in ("11", "22", "33", "44")] * 3  # 44 always wrong at 1x
            + [rec("ggd", 512, a, a in ("11", "22")) for a in ("11", "22", "33", "44")]  # 50%: counted
            + [rec("ggd", 1024, a, False) for a in ("11", "22", "33", "44")]  # 0%: a length effect, left out
            + [rec("rope", 256, a, True) for a in ("11", "22")])
    assert failing_needles(recs, ["ggd", "rope"]) == ["ggd: 1 of 4 needles hold 4 of 5 failures: 44 (0/4 right)"]
    assert failing_needles([rec("ggd", 256, "55", False)] + [rec("ggd", 256, "66", True)] * 2, ["ggd"]) == []  # 1 cell
    recs += [rec("ggd", 256, "33", False)] * 5  # a second needle, wrong in 6 of its 9 cells
    assert failing_needles(recs, ["ggd"], shown=1) == [
        "ggd: 2 of 4 needles hold 10 of 10 failures: 33 (3/9 right), and 1 more"]


def test_paired_schemes_table_counts_gains_and_losses_against_ggd_on_the_same_instances():
    from posbias.study.report import paired_schemes_table

    def rec(model, length, i, right, logprob):
        return {"model": model, "length": length, "id": f"q{i}", "depth": 0.5, "answers": ["1"],
                "tf_em": right, "tf_logprob": logprob, "n_tokens": 2}

    recs = ([rec("ggd", 256, i, i < 3, -1.0) for i in range(4)]  # ggd: q0-q2 right
            + [rec("alibi", 256, i, i in (1, 2, 3), -0.5) for i in range(4)]  # alibi: gains q3, loses q0
            + [rec("ggd", 512, i, True, -1.0) for i in range(4)]
            + [rec("alibi", 512, i, False, -3.0) for i in range(2)])  # scored on 2 of the 4 only
    table = paired_schemes_table("passkey", recs, ["alibi", "ggd"], [256, 512, 1024], 256)
    row = next(line for line in table.splitlines() if line.startswith("| alibi"))
    cells = [c.strip() for c in row.split("|")[2:-1]]
    assert table.startswith("## passkey, paired against ggd (the same instances)")
    # d = (-1, 0, 0, +1): Newcombe's paired score interval (the normal one was [-80, +80])
    assert cells[0] == "+1/-1, +0 [-55, +55], +0.250 +- 0.000"
    lost = re.fullmatch(r"\+0/-2, -100 \[-100, (-\d+)\], -1\.000.*", cells[1])  # paired on the 2 shared ids only
    assert lost and int(lost.group(1)) > -100  # two lost answers are no certainty of -100 (was [-100, -100])
    assert cells[2] == ""  # not scored
    assert paired_schemes_table("x", recs, ["ggd"], [256], 256) == ""  # nothing to pair


def test_probe_history_reads_every_probe_and_skips_schemes_never_probed(tmp_path):
    from posbias.study.plots import plot_probe_curves

    _model(tmp_path, "ggd", [{"step": 1, "loss": 2.0}, {"step": 1, "passkey_em": 0.0, "passkey_logprob": -9.0},
                             {"step": 2, "passkey_em": 0.5, "passkey_logprob": -2.0, "niah_em": 0.25,
                              "niah_logprob": -3.0}])
    _model(tmp_path, "rope", [{"step": 1, "loss": 2.0}])
    history = probe_history(trainer_logs(tmp_path, ["ggd", "rope"]))
    assert history == {"ggd": [{"step": 1, "passkey_em": 0.0, "niah_em": None},
                               {"step": 2, "passkey_em": 0.5, "niah_em": 0.25}]}
    png = plot_probe_curves(history, tmp_path / "probes.png", target=0.95)
    assert png.stat().st_size > 0


def test_the_summary_header_names_model_options_only_when_set(tmp_path):
    from posbias.study.config import StudyConfig
    from posbias.study.report import _header

    assert "model options" not in _header(StudyConfig(out=str(tmp_path)))
    header = _header(StudyConfig(out=str(tmp_path), model_options={"rope_theta": 1e4}))
    assert "training options: none, model options: rope_theta=10000.0;" in header
