"""posbias compare: methods side by side, including one method at several settings (variants)."""
import json
import re

import pytest
from conftest import save_tiny_folder
from typer.testing import CliRunner

from posbias.cli.main import app
from posbias.utils.io import read_jsonl

runner = CliRunner()


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
    return save_tiny_folder(tmp_path_factory.mktemp("tiny-cmp"), max_positions=4096)


def _compare(folder, out, methods, *extra):
    return runner.invoke(app, ["compare", "--model", folder, "--task", "kv", "--num-keys", "6", "--n", "2",
                               "--depths", "0,0.5,1", "--methods", methods, "--out", str(out), *extra])


def test_variants_of_one_method_sit_side_by_side(tiny_folder, tmp_path):
    out = tmp_path / "cmp"
    r = _compare(tiny_folder, out, "none,pi@factor=1.0,pi@factor=3.0,pi")
    assert r.exit_code == 0, r.output
    rows = {m: read_jsonl(out / m / "results.jsonl") for m in ("none", "pi@factor=1.0", "pi@factor=3.0", "pi")}
    # factor 1 is the identity: the same scores as none, bit for bit; factor 3 changes them
    assert [x["tf_logprob"] for x in rows["pi@factor=1.0"]] == [x["tf_logprob"] for x in rows["none"]]
    assert [x["tf_logprob"] for x in rows["pi@factor=3.0"]] != [x["tf_logprob"] for x in rows["none"]]
    assert [x["id"] for x in rows["pi@factor=3.0"]] == [x["id"] for x in rows["none"]]  # same instances
    options = {m: json.loads((out / m / "config.json").read_text())["config"]["method_options"] for m in rows}
    assert options["pi@factor=3.0"] == {"factor": 3.0} and options["pi"] == {"factor": 1.1}  # --pi-factor default
    table = (out / "comparison.md").read_text()
    assert "| pi@factor=3.0 |" in table and "| pi |" in table
    paired = table[table.index("Paired against `none`"):]
    identity = next(line for line in paired.splitlines() if line.startswith("| pi@factor=1.0 |"))
    # 3 depths and all: the identity (no answer changes, log-probs equal); a few questions that agree still
    # leave an interval of their own size, never +0 [+0, +0]
    cells = re.findall(r"\+0/-0, \+0 \[(-\d+), \+(\d+)\], \+0\.000 \+- 0\.000", identity)
    assert len(cells) == 4 and all(int(lo) < 0 < int(hi) for lo, hi in cells)


def test_a_variant_overrides_the_tuned_setting(tiny_folder, tmp_path):
    settings = tmp_path / "best_settings.json"
    settings.write_text(json.dumps({"pi": {"factor": 2.0}}))
    out = tmp_path / "cmp"
    r = _compare(tiny_folder, out, "pi@factor=1.5,pi", "--settings", str(settings))
    assert r.exit_code == 0, r.output
    cfg = {m: json.loads((out / m / "config.json").read_text())["config"]["method_options"]
           for m in ("pi", "pi@factor=1.5")}
    assert cfg == {"pi": {"factor": 2.0}, "pi@factor=1.5": {"factor": 1.5}}


def test_a_variant_naming_a_file_gets_a_flat_folder(tiny_folder, tmp_path):
    from posbias.evaluation.compare import method_folder

    assert method_folder("lpes@factors=runs/a b/best.json") == "lpes@factors=runs_a_b_best.json"


@pytest.mark.parametrize("methods, message", [
    ("pi@factr=2", "method 'pi' has no option(s) factr"),
    ("pi@", "write name@key=value@key=value"),
    ("pi@factor", "--methods expects key=value, got 'factor'"),
    ("nope@x=1", "unknown method 'nope'"),
    ("lpes@factors=a/b.json,lpes@factors=a_b.json", "would share one folder"),
    ("none,pi", "--routers is only used by moice"),
])
def test_a_bad_variant_is_one_clear_line_before_anything_is_written(tiny_folder, tmp_path, methods, message):
    out = tmp_path / "cmp"
    extra = ["--routers", str(tmp_path)] if "routers" in message else []
    r = _compare(tiny_folder, out, methods, *extra)
    assert r.exit_code != 0 and message in r.output and "Traceback" not in r.output
    assert not out.exists()


def test_the_joint_table_holds_every_method_the_folder_has_finished(tiny_folder, tmp_path):
    out = tmp_path / "cmp"
    assert _compare(tiny_folder, out, "none,pi@factor=1.0").exit_code == 0
    alone = (out / "comparison.md").read_text()
    r = _compare(tiny_folder, out, "pi@factor=3.0")  # a later invocation with one new method
    assert r.exit_code == 0, r.output
    table = (out / "comparison.md").read_text()
    rows = [line.split(" |")[0] for line in table.splitlines() if line.startswith("| ") and "depth" not in line]
    assert rows[:3] == ["| none", "| pi@factor=1.0", "| pi@factor=3.0"]  # first-asked order, from the earlier run
    assert "Paired against `none`" in table  # still paired against the first method of the folder
    assert table.startswith(alone.split("\n\naccuracy")[0])  # the earlier rows unchanged, read from their summaries
    assert (out / "comparison.png").exists()


def test_the_plot_shows_the_paired_differences_of_the_table(tiny_folder, tmp_path):
    from posbias.evaluation.compare import folder_records, paired_by_depth, paired_table

    out = tmp_path / "cmp"
    assert _compare(tiny_folder, out, "none,pi@factor=1.0,pi@factor=3.0").exit_code == 0
    records = folder_records({m: out / m for m in ("none", "pi@factor=1.0", "pi@factor=3.0")})
    paired = paired_by_depth(records)
    assert list(paired) == ["pi@factor=1.0", "pi@factor=3.0"]
    identity = paired["pi@factor=1.0"]
    assert [r["depth"] for r in identity] == [0.0, 0.5, 1.0] and all(r["n"] == 2 for r in identity)
    assert all(r["diff"] == 0.0 and r["ci_low"] < 0 < r["ci_high"] for r in identity)  # the identity, on 2 questions
    table = paired_table(records).splitlines()
    row = next(line for line in table if line.startswith("| pi@factor=3.0 |")).split(" | ")[1:4]
    assert [f"{100 * r['diff']:+.0f} [{100 * r['ci_low']:+.0f}, {100 * r['ci_high']:+.0f}]"
            for r in paired["pi@factor=3.0"]] \
        == [cell.split(", ", 1)[1].split("]")[0] + "]" for cell in row]  # the plot's points are the table's figures
    assert paired_by_depth(folder_records({"none": out / "none"})) == {}


@pytest.mark.parametrize("label, short", [
    ("lpes@factors=docs/results/qwen_kv100_seed0_factors.json", "lpes@factors=qwen_kv100_seed0_factors"),
    ("moice@routers=runs/a/routers.safetensors@top_k=2", "moice@routers=routers@top_k=2"),
    ("ms-poe@r_min=1.2@r_max=1.8", "ms-poe@r_min=1.2@r_max=1.8"),
    ("none", "none"),
])
def test_legend_labels_name_files_by_their_stem(label, short):
    from posbias.evaluation.plots import short_label

    assert short_label(label) == short


def test_paired_intervals_stay_within_what_accuracy_allows():
    """+50 points on 2 questions: the normal interval would reach +148; a difference of accuracies
    cannot leave [-100, +100] points."""
    from posbias.evaluation.stats import paired_difference

    d = paired_difference([0, 0], [1, 0])
    assert d["diff"] == 0.5 and d["ci95"][1] <= 1.0 and -1.0 <= d["ci95"][0] < 0.5 < d["ci95"][1]


@pytest.mark.parametrize("a, b", [([1, 1, 1], [0, 0, 0]), ([1, 1], [1, 1]), ([0, 0, 0, 0], [0, 0, 0, 0]),
                                  ([1, 0, 1, 0], [1, 0, 1, 0])])
def test_paired_intervals_of_a_few_agreeing_questions_are_never_zero_width(a, b):
    """A constant difference on 2-4 questions is no certainty: ``-100 [-100, -100]`` and ``+0 [+0, +0]``
    were the normal interval's answer; the paired score interval keeps the uncertainty."""
    from posbias.evaluation.stats import paired_difference

    d = paired_difference(a, b)
    low, high = d["ci95"]
    assert d["interval"] == "newcombe" and low <= d["diff"] <= high and high - low > 0.2
    assert -1.0 <= low and high <= 1.0


def test_paired_interval_matches_the_normal_one_on_many_questions():
    import math
    import random

    from posbias.evaluation.stats import paired_difference

    rng = random.Random(0)
    a = [float(rng.random() < 0.7) for _ in range(400)]
    b = [x if rng.random() < 0.9 else 1.0 - x for x in a]
    d = [y - x for x, y in zip(a, b)]
    mean = sum(d) / len(d)
    half = 1.96 * math.sqrt(sum((x - mean) ** 2 for x in d) / (len(d) - 1) / len(d))
    low, high = paired_difference(a, b)["ci95"]
    assert low == pytest.approx(mean - half, abs=0.006) and high == pytest.approx(mean + half, abs=0.006)
    assert paired_difference([0.5, 1.0], [1.0, 1.0])["interval"] == "normal"  # partial credit


def test_a_large_log_prob_difference_keeps_its_interval():
    """The accuracy interval is clipped to +-100 points; the log-prob interval is not clipped at all."""
    from posbias.evaluation.compare import paired_cell

    base = {f"i{k}": {"correct": 1.0, "tf_logprob": -0.5 - 0.1 * k, "n_tokens": 1} for k in range(6)}
    other = {f"i{k}": {"correct": 0.0, "tf_logprob": -3.5 - 0.3 * k, "n_tokens": 1} for k in range(6)}
    cell = paired_cell(base, other, list(base))
    acc, lp = cell.split(", ", 1)[1], cell.rsplit(", ", 1)[1]
    assert acc.startswith("-100 [-100, -")  # every answer lost: the interval still reaches towards 0
    mean, half = lp.split(" +- ")
    assert float(mean) == pytest.approx(-3.5, abs=1e-3) and float(half) > 0


def test_default_methods_are_the_ones_a_user_can_read(tiny_folder, tmp_path, factors):
    """Without --methods: the model and PI, plus LPES with --factors; Ms-PoE (0% at its published ratios on the
    packaged models) and Attention Buckets (7 passes) only when named."""
    base = ["compare", "--model", tiny_folder, "--task", "kv", "--num-keys", "4", "--n", "1", "--depths", "0"]
    r = runner.invoke(app, [*base, "--out", str(tmp_path / "a")])
    assert r.exit_code == 0, r.output
    assert sorted(p.name for p in (tmp_path / "a").iterdir() if p.is_dir()) == ["none", "pi"]
    r = runner.invoke(app, [*base, "--factors", factors, "--out", str(tmp_path / "b")])
    assert r.exit_code == 0, r.output
    assert sorted(p.name for p in (tmp_path / "b").iterdir() if p.is_dir()) == ["lpes", "none", "pi"]
