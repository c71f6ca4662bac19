"""The README's Python snippet runs, and its ``remove()`` restores the model bit for bit.

The first ```python block of README.md is executed as written, except that the default model's alias
(``smollm2-135m``) is replaced by a tiny random Hugging Face folder, so the test takes a second.
"""
from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import pytest
import torch
from conftest import save_tiny_folder

from posbias.methods import MethodHandle
from posbias.models import load_model
from posbias.patching import ScalingHandle, apply_layer_scaling

README = Path(__file__).resolve().parents[2] / "README.md"
DEFAULT_ALIAS = "smollm2-135m"


def first_python_block(text: str) -> str:
    """The body of the first fenced ```python block of a markdown text."""
    match = re.search(r"^```python\n(.*?)^```", text, flags=re.DOTALL | re.MULTILINE)
    if match is None:
        raise AssertionError("README.md has no ```python block")
    return match.group(1)


def probe_logits(model) -> torch.Tensor:
    """Logits of a fixed 64-token input (positions far enough apart for a RoPE change to show)."""
    ids = torch.arange(3, 67).unsqueeze(0) % model.config.vocab_size
    with torch.no_grad():
        return model(input_ids=ids).logits


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
    return save_tiny_folder(tmp_path_factory.mktemp("readme-tiny"), layers=4)


def run_snippet(code: str) -> tuple[dict, str]:
    namespace: dict = {"__name__": "readme_snippet"}
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, str(README), "exec"), namespace)
    return namespace, out.getvalue()


def test_first_python_block_is_found():
    code = first_python_block("text\n```bash\nls\n```\n```python\nx = 1\n```\n```python\ny = 2\n```\n")
    assert code == "x = 1\n"


def test_readme_snippet_runs_and_remove_restores_the_model(tiny_folder):
    code = first_python_block(README.read_text(encoding="utf-8"))
    code = code.replace(DEFAULT_ALIAS, Path(tiny_folder).as_posix())  # inside the snippet's quotes

    namespace, printed = run_snippet(code)

    models = [v for v in namespace.values() if isinstance(v, torch.nn.Module)]
    handles = [v for v in namespace.values() if isinstance(v, (ScalingHandle, MethodHandle))]
    assert len(models) == 1, "the snippet should load one model"
    assert handles, "the snippet should apply a method or a scaling and keep its handle"
    assert printed.strip() != "" or "print(" not in code
    model = models[0]
    for handle in handles:
        assert handle.removed, "the snippet should end by removing what it applied"

    reference, _ = load_model(tiny_folder)
    expected = probe_logits(reference)
    assert torch.equal(probe_logits(model), expected), "remove() did not restore the model bit for bit"

    scaling = [h for h in handles if isinstance(h, ScalingHandle)]
    if scaling:  # the factors the snippet applied do change the model while active
        with apply_layer_scaling(model, scaling[0].factors):
            assert not torch.equal(probe_logits(model), expected)
        assert torch.equal(probe_logits(model), expected)


def test_the_readme_states_no_figure_that_drifts_with_every_change():
    """Test counts and the commits a timing was taken on go stale with every change: they live in CHANGELOG.md."""
    text = README.read_text()
    assert not re.search(r"\b\d[\d,]* (passed|tests)\b", text), "a test count in README.md"
    assert not re.search(r"fresh clone of [0-9a-f]{7}", text), "a commit-bound timing in README.md"


def test_the_quickstart_runs_posbias_from_its_virtual_environment():
    """`posbias: command not found` after `make demo`: the quickstart activates the venv before its first command."""
    text = README.read_text()
    quick = text[text.index("## Quickstart"):]
    block = quick[quick.index("```bash"):quick.index("```", quick.index("```bash") + 3)]
    lines = [line for line in re.sub(r"\\\n\s*", " ", block).splitlines()[1:] if line.strip()]
    assert lines[0] == "source .venv/bin/activate"
    assert all("# ~" in line or "# seconds" in line for line in lines[1:] if line.startswith("posbias "))


def test_every_quickstart_command_takes_the_options_it_is_given():
    from typer.testing import CliRunner

    from posbias.cli.main import app

    text = README.read_text()
    quick = text[text.index("## Quickstart"):]
    block = quick[quick.index("```bash") + 7:quick.index("```", quick.index("```bash") + 3)]
    commands = re.sub(r"\\\n\s*", " ", block).splitlines()
    for line in (c.split("#")[0].split() for c in commands if c.startswith("posbias ")):
        sub = line[1]
        known = CliRunner().invoke(app, [sub, "--help"], env={"COLUMNS": "300"}).output
        for option in (w for w in line[2:] if w.startswith("--")):
            assert option in known, f"posbias {sub} has no option {option}"
