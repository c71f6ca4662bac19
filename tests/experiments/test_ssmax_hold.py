"""experiments/extrapolation-256/ssmax_hold.py: a study's SSMax model re-scored with its multiplier held, paired with
the study."""
from __future__ import annotations

import json

import pytest
import torch
from conftest import load_experiment, make_tiny_tokenizer

from posbias.study.grid import PASSKEY_FILE, evaluate_model
from posbias.utils.io import read_jsonl
from posbias.utils.run_folder import open_run


def _study(tmp_path, normaliser="ssmax"):
    from posbias.bam import build_model
    from posbias.study.config import StudyConfig

    out = tmp_path / "study"
    open_run(out, "study", {"train_context": 192, "depths": [0.5], "n": 2, "seed": 0}).commit()
    torch.manual_seed(0)
    model = build_model("tiny", pe="ggd", normaliser=normaliser, vocab_size=512, hidden_size=32, num_hidden_layers=1,
                        num_attention_heads=2, intermediate_size=64, max_position_embeddings=192, pad_token_id=0,
                        bos_token_id=1, eos_token_id=2).eval()
    tok = make_tiny_tokenizer()
    model.save_pretrained(out / "models" / "m" / "final")
    tok.save_pretrained(out / "models" / "m" / "final")
    (out / "models.json").write_text(json.dumps({"ggd+ssmax": "models/m/final"}))
    grid = StudyConfig(out=str(out), train_context=192, multipliers=[1, 2], depths=[0.5], n=2, seed=0,
                       modes=["teacher-forced"], niah=True, ppl_multipliers=[])
    evaluate_model(model, tok, grid, name="ggd+ssmax", progress=False, log=lambda *a: None)
    return out


def test_held_at_the_training_length_nothing_changes_there_and_rows_are_paired(tmp_path):
    mod = load_experiment("extrapolation-256", "ssmax_hold")
    study = _study(tmp_path)
    text = mod.main(["--study", str(study), "--multipliers", "1,2", "--out", str(tmp_path / "held"), "--niah"])
    rows = [line for line in text.splitlines() if "x) |" in line]
    assert "## passkey" in text and "## niah" in text and len(rows) == 4  # 2 lengths x 2 views
    assert rows[0].startswith("| 192 (1x) |") and rows[0].endswith("(n = 2) |") and rows[1].startswith("| 384 (2x) |")
    logprob = {}
    for folder in ("study", "held"):
        for r in read_jsonl(tmp_path / folder / PASSKEY_FILE):
            logprob.setdefault((r["length"], r["id"]), []).append(r["tf_logprob"])
    at = {L: [v for (length, _), v in logprob.items() if length == L] for L in (192, 384)}
    assert all(len(v) == 2 and v[0] == v[1] for v in at[192])  # no query sees more than 192 keys: identical
    assert all(len(v) == 2 and v[0] != v[1] for v in at[384])  # beyond it the multiplier is held
    assert (tmp_path / "held" / "summary.md").exists()
    assert mod.hold_multiplier(torch.nn.Linear(2, 2), 8) == 0


def test_a_scheme_the_study_did_not_train_is_refused(tmp_path):
    mod = load_experiment("extrapolation-256", "ssmax_hold")
    with pytest.raises(SystemExit, match="no trained model for 'ggd'"):
        mod.main(["--study", str(_study(tmp_path)), "--scheme", "ggd", "--out", str(tmp_path / "x")])
