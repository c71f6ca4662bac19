"""``posbias apply``: an adapter folder (base model + method) and a merged folder that plain transformers
loads with the scaling active (``trust_remote_code=True``), and the folders of older versions."""
import json
from pathlib import Path

import pytest
import torch
from conftest import TINY_FACTORS
from typer.testing import CliRunner

from posbias.cli.main import app
from posbias.patching.rope_scaling import apply_layer_scaling, save_factors_file

runner = CliRunner()
FACTORS = TINY_FACTORS  # the factors of the conftest fixture `factors`
IDS = torch.tensor([[5, 17, 99, 3, 250, 41, 7, 300, 12, 64]])


def _logits(model, ids=IDS):
    with torch.no_grad():
        return model(input_ids=ids).logits


def _patched_reference(base_folder, factors_list=FACTORS):
    """posbias's own patched model: the base folder loaded plainly, scaled by apply_layer_scaling."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(base_folder).eval()
    apply_layer_scaling(model, factors_list)
    return model


def _apply(*args):
    res = runner.invoke(app, ["apply", *map(str, args)])
    assert res.exit_code == 0, res.output
    return res


def test_adapter_folder_is_small_and_loads_as_base_plus_method(tiny, factors, tmp_path):
    from posbias.models import load_model

    out = tmp_path / "adapter"
    _apply("--model", tiny, "--factors", factors, "--out", out)
    names = sorted(p.name for p in out.iterdir())
    assert names == ["README.md", "posbias_adapter.json", "posbias_factors.json"]
    assert sum(p.stat().st_size for p in out.iterdir()) < 16_000
    doc = json.loads((out / "posbias_adapter.json").read_text())
    assert doc["method"] == "lpes" and doc["options"] == {"factors": "posbias_factors.json"} and not doc["merged"]
    assert doc["base_model"]["spec"] == tiny and doc["base_model"]["num_layers"] == 3
    model, _ = load_model(str(out))
    assert torch.equal(_logits(model), _logits(_patched_reference(tiny)))
    assert not any(p.name.startswith(".") for p in tmp_path.iterdir())  # no staging folder left


def test_eval_of_an_adapter_records_its_method(tiny, factors, tmp_path):
    out = tmp_path / "adapter"
    _apply("--model", tiny, "--factors", factors, "--out", out)
    run = tmp_path / "run"
    res = runner.invoke(app, ["eval", "--model", str(out), "--task", "kv", "--num-keys", "6", "--n", "1",
                              "--depths", "0,1", "--out", str(run)])
    assert res.exit_code == 0, res.output
    cfg = json.loads((run / "config.json").read_text())["config"]
    assert cfg["method"] == "lpes" and cfg["method_options"]["factors"] == str((out / "posbias_factors.json").resolve())
    assert cfg["adapter"]["base_model"]["spec"] == tiny and cfg["adapter"]["merged"] is False
    # the same instances scored on the base model with --method lpes give the same results
    ref = tmp_path / "ref"
    res = runner.invoke(app, ["eval", "--model", tiny, "--task", "kv", "--num-keys", "6", "--n", "1",
                              "--depths", "0,1", "--method", "lpes", "--factors", factors, "--out", str(ref)])
    assert res.exit_code == 0, res.output

    def rows(folder):
        records = map(json.loads, (folder / "results.jsonl").read_text().splitlines())
        return [(r["tf_logprob"], r["tf_em"]) for r in records]

    assert rows(run) == rows(ref)
    res = runner.invoke(app, ["eval", "--model", str(out), "--task", "kv", "--num-keys", "6", "--n", "1",
                              "--method", "pi", "--out", str(tmp_path / "stacked")])
    assert res.exit_code == 2 and "carries method lpes" in res.output
    assert not (tmp_path / "stacked").exists()
    # the run's config.json (method lpes and the folder's factors) re-used as --config is the same request
    res = runner.invoke(app, ["eval", "--config", str(run / "config.json"), "--out", str(tmp_path / "again")])
    assert res.exit_code == 0, res.output
    assert rows(tmp_path / "again") == rows(run)


def test_pi_and_ms_poe_adapters(tiny, tmp_path):
    from posbias.methods import apply_method
    from posbias.models import load_model

    _apply("--model", tiny, "--method", "pi", "--method-opt", "factor=2", "--out", tmp_path / "pi")
    model, _ = load_model(str(tmp_path / "pi"))
    assert torch.equal(_logits(model), _logits(_patched_reference(tiny, [2.0] * 3)))
    _apply("--model", tiny, "--method", "ms-poe", "--method-opt", "r_max=2.0", "--out", tmp_path / "mspoe")
    model, _ = load_model(str(tmp_path / "mspoe"))
    ref, _ = load_model(tiny)
    with apply_method(ref, "ms-poe", r_max=2.0) as h:
        assert torch.equal(_logits(model), _logits(h.model))


def test_merged_folder_loads_scaled_in_plain_transformers(tiny, factors, tmp_path):
    from transformers import AutoModelForCausalLM

    from posbias.models import load_model

    out = tmp_path / "merged"
    _apply("--model", tiny, "--factors", factors, "--out", out, "--merge")
    assert {"modeling_posbias.py", "config.json", "model.safetensors", "posbias_adapter.json",
            "posbias_factors.json", "tokenizer.json"} <= {p.name for p in out.iterdir()}
    reference = _logits(_patched_reference(tiny))
    remote = AutoModelForCausalLM.from_pretrained(out, trust_remote_code=True).eval()
    assert type(remote).__name__ == "LlamaForCausalLM"
    assert torch.equal(_logits(remote), reference)  # bit for bit the model posbias patches itself
    plain = AutoModelForCausalLM.from_pretrained(tiny).eval()
    assert not torch.equal(_logits(plain), reference)  # the scaling changes the logits
    ids = torch.randint(3, 500, (2, 40), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[1, :5] = 0  # left padding: gathered positions
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        got = remote(input_ids=ids, attention_mask=mask, position_ids=pos).logits
        want = _patched_reference(tiny)(input_ids=ids, attention_mask=mask, position_ids=pos).logits
    assert torch.equal(got, want)
    model, _ = load_model(str(out))  # posbias reads it with its own lpes
    assert torch.equal(_logits(model), reference)


def test_merged_folder_without_trust_remote_code_is_refused(tiny, factors, tmp_path):
    from transformers import AutoConfig, AutoModelForCausalLM

    out = tmp_path / "merged"
    _apply("--model", tiny, "--factors", factors, "--out", out, "--merge")
    for load in (AutoModelForCausalLM.from_pretrained, AutoConfig.from_pretrained):
        with pytest.raises(ValueError, match="trust_remote_code|custom code|posbias-scaled"):
            load(out, trust_remote_code=False)


def test_a_folder_of_the_old_apply_still_loads_and_records_lpes(tiny, factors, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from posbias.models import load_model
    from posbias.patching.rope_scaling import save_patched_model

    old = save_patched_model(AutoModelForCausalLM.from_pretrained(tiny), AutoTokenizer.from_pretrained(tiny),
                             factors, tmp_path / "old")
    model, _ = load_model(str(old))
    assert torch.equal(_logits(model), _logits(_patched_reference(tiny)))
    run = tmp_path / "run"
    res = runner.invoke(app, ["eval", "--model", str(old), "--task", "kv", "--num-keys", "6", "--n", "1",
                              "--depths", "0", "--out", str(run)])
    assert res.exit_code == 0, res.output
    cfg = json.loads((run / "config.json").read_text())["config"]
    assert cfg["method"] == "lpes" and cfg["adapter"]["legacy"] is True


def test_apply_replaces_its_own_folder_and_refuses_bad_requests(tiny, factors, tmp_path):
    out = tmp_path / "adapter"
    _apply("--model", tiny, "--factors", factors, "--out", out)
    _apply("--model", tiny, "--method", "pi", "--method-opt", "factor=1.5", "--out", out)
    assert json.loads((out / "posbias_adapter.json").read_text())["method"] == "pi"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["adapter"]
    for args, message in ((["--method", "attention-buckets"], "cannot write attention-buckets: it is a wrapper"),
                          (["--method", "moice"], "moice with trained routers"),
                          (["--method", "moice", "--routers", str(tmp_path), "--merge"], "moice changes attention"),
                          (["--method", "ms-poe", "--merge"], "--merge writes per-layer RoPE factors"),
                          (["--method", "lpes"], "needs its factors file"),
                          (["--model", str(out), "--method", "pi"], "give its base model")):
        args = args if "--model" in args else ["--model", tiny, *args]
        res = runner.invoke(app, ["apply", *args, "--out", str(tmp_path / "bad")])
        assert res.exit_code == 2 and message in res.output, res.output
        assert not (tmp_path / "bad").exists()


def test_a_broken_adapter_file_is_one_line(tmp_path):
    from posbias.models import load_model

    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "posbias_adapter.json").write_text('{"format": "posbias-adapter", "version": 9}')
    with pytest.raises(ValueError, match="adapter version 9"):
        load_model(str(tmp_path / "a"))


@pytest.mark.parametrize("variant", ["qwen2", "gemma3"])
def test_merged_folder_of_other_layouts(variant, tmp_path):
    """Qwen2 and Gemma 3 (a rotary base per layer type): the merged folder's own code gives posbias's logits."""
    from conftest import make_tiny_tokenizer, make_variant_model
    from transformers import AutoModelForCausalLM

    model = make_variant_model(variant)
    model.save_pretrained(tmp_path / "base")
    make_tiny_tokenizer().save_pretrained(tmp_path / "base")
    per_layer = [1.0 + 0.5 * i for i in range(model.config.num_hidden_layers)]
    factors = tmp_path / "f.json"
    save_factors_file(factors, factors=per_layer)
    _apply("--model", tmp_path / "base", "--factors", factors, "--out", tmp_path / "merged", "--merge")
    remote = AutoModelForCausalLM.from_pretrained(tmp_path / "merged", trust_remote_code=True).eval()
    assert torch.equal(_logits(remote), _logits(_patched_reference(tmp_path / "base", per_layer)))


def test_a_loaded_adapter_is_known_by_its_model_and_freed_with_it(tiny, factors, tmp_path):
    import gc
    import weakref

    from posbias.models import load_model
    from posbias.models.adapter import active_adapter

    _apply("--model", tiny, "--factors", factors, "--out", tmp_path / "adapter")
    model, _ = load_model(str(tmp_path / "adapter"))
    assert active_adapter(model).method == "lpes"
    ref = weakref.ref(model)
    del model
    gc.collect()
    assert ref() is None


def _text(res) -> str:
    """The output as one line (a long path may be wrapped)."""
    return " ".join(res.output.split())


def _routers(base_folder, out):
    """Untrained MoICE routers for the tiny base model, saved as posbias train-moice saves them."""
    from transformers import AutoModelForCausalLM

    from posbias.methods import apply_method
    from posbias.methods.moice import save_routers

    model = AutoModelForCausalLM.from_pretrained(base_folder).eval()
    with pytest.warns(UserWarning, match="untrained"):
        handle = apply_method(model, "moice", multipliers=[1.0, 2.0, 4.0], seed=3)
    save_routers(handle.state["routers"], out)
    handle.remove()
    return out


def test_moice_adapter_carries_its_routers_and_gives_the_method_logits(tiny, tmp_path):
    import shutil

    from posbias.methods import apply_method
    from posbias.models import load_model

    routers = _routers(tiny, tmp_path / "routers")
    out = tmp_path / "adapter"
    _apply("--model", tiny, "--method", "moice", "--routers", routers, "--method-opt", "top_k=2", "--out", out)
    assert sorted(p.name for p in (out / "moice_routers").iterdir()) == ["moice_config.json", "routers.safetensors"]
    doc = json.loads((out / "posbias_adapter.json").read_text())
    assert doc["method"] == "moice" and doc["options"] == {"routers": "moice_routers", "top_k": 2,
                                                           "rotated_cache": True}
    ref, _ = load_model(tiny)
    with apply_method(ref, "moice", routers=str(routers), top_k=2) as h:
        want = _logits(h.model)
    assert not torch.equal(want, _logits(ref))  # the routers change the logits
    shutil.rmtree(routers)  # the folder holds its own copy
    model, _ = load_model(str(out))
    assert torch.equal(_logits(model), want)
    run = tmp_path / "run"
    res = runner.invoke(app, ["eval", "--model", str(out), "--task", "kv", "--num-keys", "6", "--n", "1",
                              "--depths", "0", "--out", str(run)])
    assert res.exit_code == 0, res.output
    cfg = json.loads((run / "config.json").read_text())["config"]
    assert cfg["method"] == "moice" and cfg["method_options"]["top_k"] == 2
    assert cfg["method_options"]["routers"] == str((out / "moice_routers").resolve())


@pytest.fixture()
def adapter(tiny, factors, tmp_path):
    out = tmp_path / "adapter"
    _apply("--model", tiny, "--factors", factors, "--out", out)
    return str(out)


@pytest.mark.parametrize("command, extra, message", [
    ("search", ["--task", "kv", "--num-keys", "4", "--population", "3", "--n-per-depth", "1"],
     "search applies per-layer RoPE factors of its own"),
    ("tune", ["--methods", "pi"], "tune applies each method's settings of its own"),
    ("analyze", ["--factors", "FACTORS"], "analyze applies per-layer factors of its own"),
    ("train-moice", ["--steps", "1"], "train-moice applies MoICE of its own"),
    ("map", ["--methods", "none,pi"], "evaluate it with method none, or evaluate pi on the base model"),
    ("compare", ["--methods", "none,pi", "--num-keys", "6"], "evaluate it with method none, or evaluate pi"),
])
def test_commands_with_a_method_of_their_own_refuse_an_adapter(adapter, tiny, factors, tmp_path, command, extra,
                                                               message):
    out = tmp_path / "out"
    extra = [factors if a == "FACTORS" else a for a in extra]
    res = runner.invoke(app, [command, "--model", adapter, "--out", str(out), *extra])
    assert res.exit_code == 2, res.output
    assert "Traceback" not in res.output and len(res.output.strip().splitlines()) <= 3  # one message
    assert "carries method lpes" in _text(res) and message in _text(res) and tiny in _text(res)
    assert not out.exists()


def test_map_of_an_adapter_records_its_method(adapter, tmp_path):
    out = tmp_path / "map"
    res = runner.invoke(app, ["map", "--model", adapter, "--out", str(out), "--lengths", "96", "--depths", "0,1",
                              "--n", "1", "--bootstrap", "20"])
    assert res.exit_code == 0, res.output
    cfg = json.loads((out / "config.json").read_text())["config"]
    assert cfg["methods"] == ["none"] and cfg["adapter"]["method"] == "lpes"
    assert cfg["adapter"]["method_options"]["factors"].endswith("posbias_factors.json")


def test_lm_eval_refuses_a_method_on_top_of_an_adapter(adapter):
    pytest.importorskip("lm_eval")
    from posbias.evaluation.lm_eval_adapter import PosbiasLM

    with pytest.raises(ValueError, match="carries method lpes"):
        PosbiasLM.create_from_arg_string(f"pretrained={adapter},method=pi,factor=2,device=cpu")


def test_positional_dims_of_an_adapter_records_its_method(adapter, tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("The grass is green. The sky is blue. The pass key is 12345. " * 100)
    out = tmp_path / "dims"
    res = runner.invoke(app, ["positional-dims", "--model", adapter, "--corpus", str(corpus), "--samples", "2",
                              "--length", "30", "--out", str(out)])
    assert res.exit_code == 0, res.output
    cfg = json.loads((out / "config.json").read_text())["config"]
    assert cfg["adapter"]["method"] == "lpes" and cfg["adapter"]["folder"] == str(tmp_path / "adapter")


def test_compare_of_an_adapter_records_its_method_at_the_top(adapter, tmp_path):
    out = tmp_path / "compare"
    res = runner.invoke(app, ["compare", "--model", adapter, "--methods", "none", "--task", "kv", "--num-keys", "6",
                              "--n", "1", "--depths", "0", "--out", str(out)])
    assert res.exit_code == 0, res.output
    top = json.loads((out / "config.json").read_text())["config"]
    assert top["methods"] == ["none"] and top["adapter"]["method"] == "lpes"
    assert json.loads((out / "none" / "config.json").read_text())["config"]["method"] == "lpes"
    assert "adapter: lpes active in every row" in (out / "comparison.md").read_text()


def test_demo_search_refuses_an_adapter_before_loading_it(adapter, tmp_path, monkeypatch):
    import posbias.models

    def never(*args, **kwargs):
        raise AssertionError("the model was loaded before the adapter was refused")

    monkeypatch.setattr(posbias.models, "load_model", never)
    out = tmp_path / "demo"
    res = runner.invoke(app, ["demo", "--search", "--model", adapter, "--out", str(out)])
    assert res.exit_code == 2, res.output
    assert "demo --search applies per-layer RoPE factors of its own" in _text(res)
    assert not out.exists()


def test_a_killed_apply_leaves_no_staging_folder_behind(tiny, factors, tmp_path):
    """A staging folder of an apply that was killed (its process gone) is removed by the next apply there."""
    import subprocess
    import sys

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    stale = tmp_path / f".adapter.apply-{dead.stdout.strip()}"
    (stale / "weights").mkdir(parents=True)
    res = _apply("--model", tiny, "--factors", factors, "--out", tmp_path / "adapter")
    assert not stale.exists() and "staging folder of a posbias apply that was killed" in res.output


def test_a_full_disk_during_merge_is_one_line(tiny, factors, tmp_path, monkeypatch):
    from safetensors import SafetensorError

    from posbias.models import export

    def full(*a, **k):
        raise SafetensorError("No space left on device (os error 28)")

    monkeypatch.setattr(export, "write_merged", full)
    res = runner.invoke(app, ["apply", "--model", tiny, "--factors", factors, "--out", str(tmp_path / "m"),
                              "--merge"])
    assert res.exit_code == 2 and "is the disk full?" in res.output and "Traceback" not in res.output
    assert not any(p.name.startswith(".m.apply-") for p in tmp_path.iterdir())


def test_an_adapter_naming_a_file_outside_its_folder_is_refused(tiny, factors, tmp_path):
    from posbias.models import load_model

    out = tmp_path / "adapter"
    _apply("--model", tiny, "--factors", factors, "--out", out)
    doc = json.loads((out / "posbias_adapter.json").read_text())
    for elsewhere in (str(factors), "../" + Path(factors).name):
        (out / "posbias_adapter.json").write_text(json.dumps({**doc, "options": {"factors": elsewhere}}))
        with pytest.raises(ValueError, match="lies outside its folder"):
            load_model(str(out))


def test_a_merged_folder_whose_two_factor_copies_disagree_or_hold_zero_is_refused(tiny, factors, tmp_path):
    from transformers import AutoModelForCausalLM

    from posbias.models import load_model

    out = tmp_path / "merged"
    _apply("--model", tiny, "--factors", factors, "--out", out, "--merge")
    config = json.loads((out / "config.json").read_text())
    edited = [2.0] + config["posbias_scaling"]["factors"][1:]
    (out / "config.json").write_text(json.dumps({**config, "posbias_scaling": {"method": "lpes", "factors": edited}}))
    with pytest.raises(ValueError, match="disagree"):
        load_model(str(out))
    zero = [0.0] + config["posbias_scaling"]["factors"][1:]
    (out / "config.json").write_text(json.dumps({**config, "posbias_scaling": {"method": "lpes", "factors": zero}}))
    with pytest.raises(ValueError, match="finite numbers > 0"):
        AutoModelForCausalLM.from_pretrained(out, trust_remote_code=True)
