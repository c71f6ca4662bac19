"""A resumed run checks the model's content, not only its name: an overwritten folder, a re-applied adapter or a
continued training run is refused in one line; a copy of the same model resumes."""
import json
import shutil

import pytest
from conftest import save_tiny_folder
from typer.testing import CliRunner

from posbias.cli.main import app
from posbias.models.fingerprint import folder_digest, model_content

runner = CliRunner()


def _eval(model, out):
    return runner.invoke(app, ["eval", "--model", str(model), "--task", "kv", "--num-keys", "4", "--n", "1",
                               "--depths", "0", "--out", str(out)])


def test_content_changes_with_the_weights_not_with_a_copy(tmp_path):
    a = save_tiny_folder(tmp_path / "a")
    b = tmp_path / "b"
    shutil.copytree(a, b)
    assert model_content(a) == model_content(str(b)) and model_content(a).startswith("files:")
    save_tiny_folder(b, seed=1)  # other weights, same names and sizes
    assert model_content(str(b)) != model_content(a)
    assert model_content("qwen2.5-coder-0.5b").startswith("sha256:1d9614638d18")  # an alias: its known digest


def test_large_files_are_sampled_at_start_middle_and_end(tmp_path):
    from posbias.models import fingerprint

    (tmp_path / "w.bin").write_bytes(b"\0" * (fingerprint.SMALL + 3 * fingerprint.SAMPLE))
    before = folder_digest(tmp_path)
    data = bytearray((tmp_path / "w.bin").read_bytes())
    data[len(data) // 2] = 1  # a byte in the middle sample
    (tmp_path / "w.bin").write_bytes(bytes(data))
    assert folder_digest(tmp_path) != before


def test_an_overwritten_model_folder_is_refused_on_resume(tmp_path):
    model = save_tiny_folder(tmp_path / "m")
    out = tmp_path / "ev"
    assert _eval(model, out).exit_code == 0
    assert json.loads((out / "config.json").read_text())["config"]["model_content"].startswith("files:")
    assert _eval(model, out).exit_code == 0  # the same model resumes
    save_tiny_folder(model, seed=3)  # overwritten in place
    res = _eval(model, out)
    assert res.exit_code == 2 and "content has changed" in res.output


def test_a_reapplied_adapter_is_refused_on_resume(tmp_path):
    from posbias.patching.rope_scaling import save_factors_file

    model = save_tiny_folder(tmp_path / "m")
    for name, factors in (("f1.json", [1.0, 1.5, 2.0]), ("f2.json", [1.0, 1.0, 3.0])):
        save_factors_file(tmp_path / name, factors=factors, model="tiny", task="kv")
    adapter, out = tmp_path / "adapter", tmp_path / "ev"
    assert runner.invoke(app, ["apply", "--model", model, "--factors", str(tmp_path / "f1.json"),
                               "--out", str(adapter)]).exit_code == 0
    assert _eval(adapter, out).exit_code == 0
    assert runner.invoke(app, ["apply", "--model", model, "--factors", str(tmp_path / "f2.json"),
                               "--out", str(adapter)]).exit_code == 0
    res = _eval(adapter, out)
    assert res.exit_code == 2 and "content has changed" in res.output


def test_a_folder_of_an_older_posbias_resumes_and_then_records_the_content(tmp_path):
    model = save_tiny_folder(tmp_path / "m")
    out = tmp_path / "ev"
    assert _eval(model, out).exit_code == 0
    cfg_path = out / "config.json"
    cfg = json.loads(cfg_path.read_text())
    del cfg["config"]["model_content"]  # as an older posbias wrote it
    cfg_path.write_text(json.dumps(cfg))
    assert _eval(model, out).exit_code == 0
    assert "model_content" in json.loads(cfg_path.read_text())["config"]


def _lpes_adapter(tmp_path, name: str):
    """An lpes adapter folder ``tmp_path / name`` over a tiny model (``posbias apply``)."""
    from posbias.patching.rope_scaling import save_factors_file

    model = save_tiny_folder(tmp_path / "m")
    save_factors_file(tmp_path / "f.json", factors=[1.0, 1.5, 2.0], model="tiny", task="kv")
    adapter = tmp_path / name
    assert runner.invoke(app, ["apply", "--model", model, "--factors", str(tmp_path / "f.json"),
                               "--out", str(adapter)]).exit_code == 0
    return adapter


def test_an_adapter_whose_base_is_itself_is_one_line(tmp_path):
    adapter = _lpes_adapter(tmp_path, "adapter")
    doc = json.loads((adapter / "posbias_adapter.json").read_text())
    doc["base_model"] = {"spec": str(adapter), "path": str(adapter)}
    (adapter / "posbias_adapter.json").write_text(json.dumps(doc))
    res = _eval(adapter, tmp_path / "ev")
    assert res.exit_code == 2 and "Traceback" not in res.output and "recursion" not in res.output
    with pytest.raises(ValueError, match="adapter chain"):
        model_content(str(adapter))


def test_an_adapter_on_an_adapter_is_refused_not_stacked(tmp_path):
    """Two methods would run and only the outer one be recorded."""
    import shutil

    from posbias.models import load_model
    from posbias.models.loader import ModelLoadError

    inner = _lpes_adapter(tmp_path, "inner")
    outer = tmp_path / "outer"
    shutil.copytree(inner, outer)
    doc = json.loads((outer / "posbias_adapter.json").read_text())
    doc["base_model"] = {"spec": str(inner), "path": str(inner)}
    (outer / "posbias_adapter.json").write_text(json.dumps(doc))
    with pytest.raises(ModelLoadError, match="is itself an adapter"):
        load_model(str(outer))
