import sys

from posbias.utils.progress import LineProgress, progress_bar, progress_iter


def test_a_log_file_gets_one_line_per_tenth(capsys, monkeypatch):
    monkeypatch.setattr(sys.stderr, "isatty", lambda: False, raising=False)
    bar = progress_bar(100, desc="eval", unit="inst")
    assert isinstance(bar, LineProgress)
    for _ in range(100):
        bar.update(1)
    bar.set_postfix(loss=1.5)
    bar.close()
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 10 and lines[0].startswith("eval: 10% (10/100 inst") and lines[-1].startswith("eval: 100%")


def test_a_resumed_run_counts_from_where_it_was(capsys, monkeypatch):
    monkeypatch.setattr(sys.stderr, "isatty", lambda: False, raising=False)
    bar = progress_bar(20, desc="x", initial=15)
    bar.update(5)
    assert capsys.readouterr().err.splitlines()[0].startswith("x: 100% (20/20 it")


def test_disabled_progress_prints_nothing(capsys, monkeypatch):
    monkeypatch.setattr(sys.stderr, "isatty", lambda: False, raising=False)
    assert list(progress_iter(range(30), desc="quiet", enabled=False)) == list(range(30))
    assert capsys.readouterr().err == ""


def test_worker_processes_report_in_lines_even_on_a_terminal(capsys, monkeypatch):
    from posbias.utils.progress import LINES_ENV, use_progress_lines

    monkeypatch.setattr(sys.stderr, "isatty", lambda: True, raising=False)
    monkeypatch.delenv(LINES_ENV, raising=False)
    assert not isinstance(progress_bar(10, desc="bar"), LineProgress)
    use_progress_lines()  # what a spawned training worker runs first
    try:
        assert isinstance(progress_bar(10, desc="train rope"), LineProgress)
    finally:
        monkeypatch.delenv(LINES_ENV, raising=False)
