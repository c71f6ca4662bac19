"""Study settings refused or normalised before any scheme is trained."""
import json

import pytest

from posbias.study.config import StudyConfig, study_modes
from posbias.study.training import is_saved_model


def test_modes_both_means_the_two_and_bad_modes_are_refused_before_training(tmp_path):
    assert study_modes(["both"]) == ["teacher-forced", "generate"]
    assert study_modes(["tf", "teacher_forced"]) == ["teacher-forced"]
    assert StudyConfig(out=str(tmp_path), modes=["both"]).modes == ["teacher-forced", "generate"]
    with pytest.raises(ValueError, match="unknown mode 'greedy'"):
        StudyConfig(out=str(tmp_path), modes=["greedy"])


def test_a_training_run_folder_is_not_a_saved_model(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text(json.dumps({"kind": "train", "config": {"steps": 10}}))
    assert not is_saved_model(run)  # what the trainer returns when stop_after ended it early
    (run / "final").mkdir()
    (run / "final" / "config.json").write_text(json.dumps({"model_type": "bam"}))
    assert is_saved_model(run / "final") and not is_saved_model(tmp_path / "missing")


def test_the_ssmax_content_ablation_is_a_scheme_of_its_own(tmp_path):
    from posbias.study.grid import parse_schemes
    from posbias.study.training import train_config

    assert parse_schemes("ggd+ssmax,ggd+ssmax-content") == ["ggd+ssmax", "ggd+ssmax-content"]
    cfg = StudyConfig(out=str(tmp_path), schemes=["ggd+ssmax", "ggd+ssmax-content"],
                      train_options={"model_overrides": {"num_hidden_layers": 2}})
    bam = train_config(cfg, "ggd+ssmax", tmp_path / "a")
    ablation = train_config(cfg, "ggd+ssmax-content", tmp_path / "b")
    assert bam.ssmax and ablation.ssmax and bam.pe == ablation.pe == "ggd"
    assert bam.model_overrides == {"num_hidden_layers": 2}
    assert ablation.model_overrides == {"num_hidden_layers": 2, "ssmax_scope": "content"}


def test_model_options_reach_every_scheme_and_a_training_option_wins(tmp_path):
    from posbias.study.training import train_config

    cfg = StudyConfig(out=str(tmp_path), schemes=["rope", "ggd+ssmax-content"], model_options={"rope_theta": 1e4},
                      train_options={"model_overrides": {"num_hidden_layers": 2, "rope_theta": 5e4}})
    assert train_config(cfg, "rope", tmp_path / "a").model_overrides == {"rope_theta": 5e4, "num_hidden_layers": 2}
    cfg.train_options = {}
    assert train_config(cfg, "rope", tmp_path / "a").model_overrides == {"rope_theta": 1e4}
    assert train_config(cfg, "ggd+ssmax-content", tmp_path / "b").model_overrides == {
        "rope_theta": 1e4, "ssmax_scope": "content"}
