"""--model as a Hugging Face Hub id, from a fake local Hugging Face cache laid out as the hub lays it out
(``models--org--name/snapshots/<commit>/...`` and ``refs/main``), with the network off."""
import json

import pytest
from conftest import save_tiny_folder
from typer.testing import CliRunner

from posbias.cli.main import app
from posbias.models import LoadOptions, ModelLoadError, load_model
from posbias.models.hub import looks_like_hub_id, resolve_hub_model

COMMIT = "0123456789abcdef0123456789abcdef01234567"
OTHER = "fedcba9876543210fedcba9876543210fedcba98"
REPO = "tiny-org/tiny-llama"


@pytest.fixture(scope="module")
def hub_cache(tmp_path_factory):
    """A hub cache holding ``tiny-org/tiny-llama`` at main (COMMIT) and at tag v1 (OTHER, other weights)."""
    cache = tmp_path_factory.mktemp("hf-home") / "hub"
    repo = cache / "models--tiny-org--tiny-llama"
    save_tiny_folder(repo / "snapshots" / COMMIT, seed=0)
    save_tiny_folder(repo / "snapshots" / OTHER, seed=1)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(COMMIT)
    (repo / "refs" / "v1").write_text(OTHER)
    return cache


@pytest.fixture()
def offline(hub_cache, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(hub_cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return hub_cache


def test_hub_ids_are_told_from_paths(tmp_path):
    assert looks_like_hub_id("Qwen/Qwen2.5-0.5B") and looks_like_hub_id("meta-llama/Llama-3.2-1B")
    assert not looks_like_hub_id("smollm2-135m") and not looks_like_hub_id("a/b/c")
    (tmp_path / "org").mkdir()
    (tmp_path / "org" / "name").mkdir()
    assert not looks_like_hub_id(str(tmp_path / "org" / "name"))


def test_a_cached_hub_id_loads_at_main_and_at_a_revision(offline):
    snap = resolve_hub_model(REPO)
    assert (snap.commit, snap.path) == (COMMIT, offline / "models--tiny-org--tiny-llama" / "snapshots" / COMMIT)
    assert resolve_hub_model(REPO, "v1").commit == OTHER
    main, _ = load_model(REPO)
    tagged, _ = load_model(REPO, LoadOptions(revision="v1"))
    first = next(iter(main.state_dict()))
    assert not main.state_dict()[first].equal(tagged.state_dict()[first])
    assert LoadOptions(revision="v1").check(REPO) == {
        "device": "cpu", "dtype": "float32", "resolved_device": "cpu", "resolved_dtype": "float32",
        "hub_id": REPO, "revision": "v1", "commit": OTHER}


def test_an_uncached_hub_id_offline_is_one_line_naming_the_download(offline):
    with pytest.raises(ModelLoadError) as e:
        load_model("tiny-org/not-cached")
    msg = str(e.value)
    assert "\n" not in msg and "HF_HUB_OFFLINE=1" in msg and "hf download tiny-org/not-cached" in msg
    with pytest.raises(ModelLoadError, match="--revision nope"):
        resolve_hub_model(REPO, "nope")


def test_eval_of_a_hub_id_records_id_revision_and_commit(offline, tmp_path):
    out = tmp_path / "run"
    res = CliRunner().invoke(app, ["eval", "--model", REPO, "--revision", "v1", "--task", "kv", "--num-keys", "4",
                                   "--n", "1", "--depths", "0,1", "--out", str(out)])
    assert res.exit_code == 0, res.output
    load = json.loads((out / "config.json").read_text())["config"]["load"]
    assert (load["hub_id"], load["revision"], load["commit"]) == (REPO, "v1", OTHER)


def test_eval_of_an_uncached_hub_id_offline_writes_nothing(offline, tmp_path):
    out = tmp_path / "run"
    res = CliRunner().invoke(app, ["eval", "--model", "tiny-org/absent", "--task", "kv", "--num-keys", "4",
                                   "--n", "1", "--out", str(out)])
    assert res.exit_code == 2 and "Traceback" not in res.output
    assert "hf download tiny-org/absent" in " ".join(res.output.split()) and not out.exists()


def test_weights_load_in_the_requested_dtype(offline):
    model, _ = load_model(REPO, LoadOptions("cpu", "bfloat16"))
    assert {p.dtype for p in model.parameters()} == {__import__("torch").bfloat16}
