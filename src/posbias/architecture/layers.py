"""What posbias needs to know of a decoder architecture, importing nothing else of posbias: where the
decoder layers are, and the one error type for a model that cannot be loaded or patched."""
from __future__ import annotations

SUPPORTED_HINT = "Llama, Qwen2, Qwen3, Mistral, Gemma 2/3, Phi-3, Cohere, OLMo 2, Granite and other RoPE causal LMs"


class ModelLoadError(RuntimeError):
    """A model spec that cannot be loaded; the message names the problem and the fix."""


def get_decoder_layers(model):
    """The decoder layers (``model.model.layers`` for Llama-family models), a ``torch.nn.ModuleList``."""
    base = getattr(model, "model", model)
    layers = getattr(base, "layers", None)
    if layers is None and getattr(getattr(base, "language_model", None), "layers", None) is not None:
        raise ModelLoadError(
            f"{type(model).__name__} is an image-text model whose text decoder sits at "
            "model.model.language_model; posbias patches text-only causal LMs (for Gemma 3: gemma-3-270m / "
            f"gemma-3-1b, model type gemma3_text; supported: {SUPPORTED_HINT})"
        )
    if layers is None:
        raise ModelLoadError(
            f"unsupported architecture {type(model).__name__}: no decoder layers at model.model.layers "
            f"(supported: {SUPPORTED_HINT})"
        )
    return layers


def execution_device(module):
    """Where ``module`` computes (a ``torch.device``): the execution device of the accelerate hook that
    transformers' ``device_map`` puts on it (its weights may sit on ``meta`` while offloaded to the CPU or
    disk, and are brought there for each forward), else the device of its first parameter."""
    import torch  # noqa: PLC0415 (this module imports nothing at load time)

    hook = getattr(module, "_hf_hook", None)
    for h in getattr(hook, "hooks", None) or ([hook] if hook is not None else []):  # a SequentialHook holds several
        device = getattr(h, "execution_device", None)
        if device is not None:
            return torch.device(device)
    return next(module.parameters()).device


def model_device(model):
    """Where a model's inputs go (a ``torch.device``): where its input embeddings compute (accelerate's
    execution device when ``device_map`` split the model or offloaded them, their weights then on
    ``meta``), else the device of its first parameter; a wrapper without parameters: its ``base_model``'s."""
    import torch  # noqa: PLC0415 (this module imports nothing at load time)

    try:
        embeddings = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
        return execution_device(embeddings if embeddings is not None else model)
    except (AttributeError, StopIteration, TypeError, NotImplementedError):
        base = getattr(model, "base_model", None)
        return model_device(base) if base is not None and base is not model else torch.device("cpu")


def cache_of(out):
    """The KV cache of a model output: its ``cache`` field (transformers >= 5.24; None without a cache), or
    ``past_key_values`` for an output class that has no ``cache`` field (reading the deprecated name where
    ``cache`` exists makes transformers print a deprecation line)."""
    if hasattr(out, "cache"):
        return out.cache
    return getattr(out, "past_key_values", None)


def repeat_cache(cache, k: int):
    """A copy of a one-row cache (or an Attention-Buckets cache of one row per base) with each row
    repeated ``k`` times (``batch_repeat_interleave`` order)."""
    import copy  # noqa: PLC0415 (this module imports nothing at load time)

    import torch  # noqa: PLC0415

    rep = copy.copy(cache)
    rep.layers = [copy.copy(layer) for layer in cache.layers]
    for layer in rep.layers:
        for name in ("keys", "values"):
            t = getattr(layer, name, None)
            if isinstance(t, torch.Tensor):
                setattr(layer, name, t.repeat_interleave(k, dim=0))
    return rep
