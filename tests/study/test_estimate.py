"""The time estimate a study prints before it starts (posbias.study.estimate)."""
import math

import pytest
import torch

from posbias.study.config import StudyConfig
from posbias.study.estimate import (
    SLIDING_WINDOW_FACTOR,
    StudyEstimate,
    estimate_study,
    fit_forward_time,
    forward_counts,
    time_training_step,
    torch_threads,
)


def tiny_model():
    """A two-layer BAM model of width 32 (random weights)."""
    from posbias.bam import build_model

    torch.manual_seed(0)
    return build_model("tiny", pe="rope", vocab_size=128, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                       intermediate_size=64, max_position_embeddings=256)


def test_forward_counts_by_hand(tmp_path):
    cfg = StudyConfig(out=str(tmp_path / "s"), schemes="rope", train_context=128, multipliers=[1, 2], depths=[0, 1],
                      n=3, modes=["teacher-forced"], ppl_multipliers=[1, 4], ppl_tokens=1000, niah_rate=0.0)
    counts = forward_counts(cfg)
    views = counts[256] // (3 * 2)  # the passkey views of the grid (instances per length: n x depths)
    assert views >= 1 and counts[256] == views * 3 * 2
    windows_128, windows_512 = math.ceil(1000 / 128), math.ceil(1000 / 512)
    # at the training context: the grid, the held-out windows (plain + sliding), the training-text windows
    assert counts[128] == views * 3 * 2 + windows_128 * (1 + SLIDING_WINDOW_FACTOR) + windows_128
    assert counts[512] == windows_512 * (1 + SLIDING_WINDOW_FACTOR)
    assert set(counts) == {128, 256, 512}


def test_forward_time_fit_is_non_negative_and_grows_with_length():
    model = tiny_model()
    a, b = fit_forward_time(model, (32, 128))
    assert a >= 0 and b >= 0 and a * 128 + b * 128 ** 2 > a * 32 + b * 32 ** 2
    a1, b1 = fit_forward_time(model, (64, 64))
    assert a1 > 0 and b1 == 0.0


def test_a_timed_training_step_is_positive_and_threads_are_restored():
    before = torch.get_num_threads()
    with torch_threads(1):
        assert torch.get_num_threads() == 1
        assert time_training_step(tiny_model(), batch_size=2, context=32) > 0
    assert torch.get_num_threads() == before


def test_estimate_of_a_study(tmp_path, tiny_tokenizer):
    cfg = StudyConfig(out=str(tmp_path / "s"), schemes="rope,alibi", train_context=64, train_steps=10, multipliers=[1],
                      depths=[0.5], n=1, modes=["teacher-forced"], ppl_multipliers=[1], ppl_tokens=256,
                      train_workers=2, train_options={"batch_size": 2})
    est = estimate_study(cfg, tiny_tokenizer, ["rope", "alibi"])
    assert est.schemes_to_train == 2 and est.step_s > 0 and est.eval_s > 0
    assert est.train_s == pytest.approx(10 * est.step_s)  # two schemes, two at a time: one round of the step cap
    assert est.forwards == 2 * sum(forward_counts(cfg).values())
    line = est.describe()
    assert line.startswith("[study] estimate: training 2 scheme(s) at most") and "forward passes" in line
    done = estimate_study(cfg, tiny_tokenizer, [])
    assert done.train_s == 0 and "every model already trained" in done.describe()


def test_describe_in_minutes_past_ninety_seconds():
    est = StudyEstimate(train_s=600, eval_s=30, schemes_to_train=1, step_s=0.12, forwards=100)
    assert "at most 10 min (120 ms a step" in est.describe() and "evaluation about 30 s" in est.describe()
