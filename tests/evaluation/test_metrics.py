import pytest

from posbias.evaluation.metrics import best_subspan_em, normalize_answer, passkey, score, string_match_all, substring
from posbias.evaluation.stats import accuracy_by_depth, wilson_interval


def test_best_subspan_em_cuts_at_newline_and_normalises():
    assert best_subspan_em("The Eiffel Tower!\nParis", ["eiffel tower"]) == 1.0
    assert best_subspan_em("It is in\nParis", ["Paris"]) == 0.0
    assert normalize_answer("  The  Quick, brown fox. ") == "quick brown fox"


def test_substring_passkey_string_match_all():
    assert substring("value: 1234567", ["1234567"]) == 1.0
    assert passkey("The pass key is 4521.", ["4521"]) == 1.0
    assert passkey("45210", ["4521"]) == 0.0
    assert string_match_all("1111 and 3333", ["1111", "2222", "3333", "4444"]) == 0.5
    with pytest.raises(ValueError, match="unknown metric"):
        score("bleu", "a", ["a"])


def test_wilson_interval_known_values():
    lo, hi = wilson_interval(5, 10)
    assert abs(lo - 0.2366) < 1e-3 and abs(hi - 0.7634) < 1e-3
    assert wilson_interval(0, 10)[0] == 0.0 and wilson_interval(10, 10)[1] == 1.0


def test_accuracy_by_depth_groups():
    recs = [{"depth": 0.0, "correct": 1}, {"depth": 0.0, "correct": 0}, {"depth": 1.0, "correct": 1}]
    rows = accuracy_by_depth(recs)
    assert [(r["depth"], r["n"], r["accuracy"]) for r in rows] == [(0.0, 2, 0.5), (1.0, 1, 1.0)]
