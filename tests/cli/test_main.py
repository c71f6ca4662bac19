"""The posbias entry point itself."""
import io
import subprocess
import sys

from posbias.cli.main import line_buffered_stdout


def test_stdout_is_line_buffered_when_it_is_a_file(monkeypatch):
    raw = io.BytesIO()
    stream = io.TextIOWrapper(raw, encoding="utf-8")  # a file-like stdout: block-buffered by default
    monkeypatch.setattr(sys, "stdout", stream)
    line_buffered_stdout()
    print("generation 0 done")
    assert raw.getvalue() == b"generation 0 done\n"  # reached the file without a flush


def test_a_stdout_without_reconfigure_is_left_alone(monkeypatch):
    class Sink:  # e.g. a test runner's capture object
        def __init__(self):
            self.text = []

        def write(self, s):
            self.text.append(s)

    stream = Sink()
    monkeypatch.setattr(sys, "stdout", stream)
    line_buffered_stdout()  # no AttributeError
    assert sys.stdout is stream and stream.text == []


def test_the_command_line_still_runs_with_a_pipe_as_stdout():
    out = subprocess.run([sys.executable, "-m", "posbias.cli.main", "tune", "--help"], capture_output=True,
                         text=True, check=True)
    assert "search split" in out.stdout


def test_no_command_has_hidden_options():
    """Every option a command takes is in its --help (no hidden flags kept for old scripts)."""
    import typer

    from posbias.cli.main import app

    group = typer.main.get_command(app)
    hidden = [f"{name} {p.opts[0]}" for name, cmd in group.commands.items() for p in cmd.params
              if getattr(p, "hidden", False)]
    assert hidden == []


def test_posbias_warnings_are_one_line_others_as_python_writes_them():
    import warnings

    from posbias.cli import main
    from posbias.patching import rope_scaling

    ours = main.one_line_warning(UserWarning("factors below 1"), UserWarning, rope_scaling.__file__, 12, "x = 1")
    assert ours == "warning: factors below 1\n"
    theirs = main.one_line_warning(UserWarning("deprecated"), UserWarning, warnings.__file__, 7, "y")
    assert "UserWarning: deprecated" in theirs and str(7) in theirs
