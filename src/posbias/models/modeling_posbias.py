"""Per-layer RoPE scaling (LPES / position interpolation) for a model folder merged by ``posbias apply --merge``.

This file is copied into the merged folder and named by its ``config.json``'s ``auto_map``, the Hugging Face
convention for custom code, so that

    AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True)

returns the base architecture's model (e.g. ``LlamaForCausalLM``, unchanged weights) with the scaling of
``config.posbias_scaling["factors"]`` active: decoder layer ``l`` sees the rotary ``(cos, sin)`` of positions
``m / factors[l]`` (linear position interpolation, Chen et al. 2023, per layer as in LPES), computed by the
model's own rotary module, as ``posbias.patching.rope_scaling`` does. It needs only torch and transformers
(5.x decoder layers that take ``position_embeddings``). Without ``trust_remote_code`` the config's model type
``posbias-scaled`` is unknown to transformers, which then refuses to load the folder instead of loading the
unscaled model.
"""
from __future__ import annotations

import inspect
import math

import torch
from transformers import AutoConfig, PretrainedConfig, PreTrainedModel
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

MODEL_TYPE = "posbias-scaled"
BASE_TYPE_KEY = "posbias_base_model_type"
BASE_ARCHITECTURES_KEY = "posbias_base_architectures"
SCALING_KEY = "posbias_scaling"
REMOTE_KEYS = ("auto_map", BASE_TYPE_KEY, BASE_ARCHITECTURES_KEY, SCALING_KEY)


class PosbiasScaledConfig(PretrainedConfig):
    """The base model's config plus ``posbias_base_model_type`` and ``posbias_scaling`` (``{"method", "factors"}``)."""

    model_type = MODEL_TYPE


def base_config(config) -> PretrainedConfig:
    """The base architecture's config inside a merged folder's config (a config object or its dict)."""
    fields = dict(config if isinstance(config, dict) else config.to_dict())
    base_type = fields.pop(BASE_TYPE_KEY)
    fields["architectures"] = fields.pop(BASE_ARCHITECTURES_KEY, None)
    for key in (*REMOTE_KEYS, "model_type", "transformers_version"):
        fields.pop(key, None)
    return AutoConfig.for_model(base_type, **fields)


class PosbiasScaledForCausalLM(PreTrainedModel):
    """Loads the base model of a merged folder and re-applies its per-layer RoPE scaling."""

    config_class = PosbiasScaledConfig

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *model_args, config=None, **kwargs):
        if config is None or not isinstance(config, PretrainedConfig):
            config = PosbiasScaledConfig.from_pretrained(pretrained_model_name_or_path)
        base = base_config(config)
        model_class = MODEL_FOR_CAUSAL_LM_MAPPING[type(base)]
        kwargs.pop("adapter_kwargs", None)
        kwargs.pop("trust_remote_code", None)
        model = model_class.from_pretrained(pretrained_model_name_or_path, *model_args, config=base, **kwargs)
        LayerScaling(model, getattr(config, SCALING_KEY)["factors"]).install()
        return model


class LayerScaling:
    """Forward pre-hooks giving decoder layer ``l`` the rotary ``(cos, sin)`` of positions ``m / factors[l]``.

    The ``(cos, sin)`` of one factor are computed once per forward pass (keyed on the ``position_ids``
    tensor) and shared by the layers with that factor and layer type; layers with factor 1 get no hook.
    """

    def __init__(self, model, factors):
        self.model = model
        self.layers = list(model.model.layers)
        self.rotary = model.model.rotary_emb
        self.factors = [float(f) for f in factors]
        if len(self.factors) != len(self.layers):
            raise ValueError(f"{len(self.factors)} factors for a model with {len(self.layers)} decoder layers")
        if not all(math.isfinite(f) and f > 0 for f in self.factors):  # 0 or NaN: NaN logits, silently
            raise ValueError(f"{SCALING_KEY} factors must be finite numbers > 0, got {self.factors}")
        self.layer_types = getattr(model.config, "layer_types", None) or [None] * len(self.layers)
        self.takes_layer_type = "layer_type" in inspect.signature(self.rotary.forward).parameters
        self._key, self._cache = None, {}

    def cos_sin(self, factor: float, positions: torch.Tensor, like: torch.Tensor, layer_type):
        """``(cos, sin)`` (B, L, rotary_dim) of ``positions / factor`` from the model's rotary module."""
        if positions is not self._key:
            self._key, self._cache = positions, {}
        key = (factor, layer_type, like.dtype)
        if key not in self._cache:
            scaled = positions.float() / factor
            args = (like, scaled, layer_type) if self.takes_layer_type else (like, scaled)
            self._cache[key] = self.rotary(*args)
        return self._cache[key]

    def _hook(self, layer_idx: int):
        factor, layer_type = self.factors[layer_idx], self.layer_types[layer_idx]

        def hook(module, args, kwargs):
            pe = kwargs.get("position_embeddings")
            pos = kwargs.get("position_ids")
            if pos is None:
                pos = kwargs["cache_position"].unsqueeze(0)
            kwargs = dict(kwargs)
            kwargs["position_embeddings"] = self.cos_sin(factor, pos, pe[0], layer_type)
            return args, kwargs

        return hook

    def install(self) -> LayerScaling:
        for i, layer in enumerate(self.layers):
            if self.factors[i] != 1.0:
                layer.register_forward_pre_hook(self._hook(i), with_kwargs=True)
        return self
