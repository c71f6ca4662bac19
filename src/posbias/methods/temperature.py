"""Attention temperature: a per-layer scale ``t_l`` of the attention logits.

In decoder layer ``l`` every query is multiplied by ``t_l`` before the dot product, so the logits
``t_l q.k / sqrt(d)`` are sharpened (``t > 1``) or flattened (``t < 1``); keys, values, the KV cache
and the attention kernel (eager, SDPA, flash) are the model's own. The query is scaled where the
model last touches it before RoPE: the output of ``q_norm`` where the layer has one (Qwen3, Gemma 3:
a scale before that norm would be normalised away), else of ``q_proj`` (Llama, Qwen2, Mistral);
RoPE is a rotation, so scaling before it equals scaling after it.

This separates two things a RoPE position-interpolation factor ``s < 1`` does at once: it spreads
the rotary angles (positions look farther apart) and, through them, changes how peaked attention is.
A per-layer temperature curve found by the same curve GA as LPES (``posbias search --target
temperature``) tells whether LPES's gain is attention sharpening alone.

Options: ``t`` (one value for every layer), ``values`` (one per layer) or ``values_file`` (the
``best_factors.json`` of a temperature search; its curve is re-evaluated for another depth).
A layer with ``t_l = 1`` gets no hook, so ``t = 1`` leaves the model bit-identical. Works with the
KV cache, shared-context scoring and generation (nothing depends on where a prompt ends).
"""
from __future__ import annotations

import math
from contextlib import ExitStack
from typing import Sequence

import torch

from posbias.architecture.layers import get_decoder_layers
from posbias.methods.registry import MethodHandle, as_list, register_method
from posbias.patching.rope_scaling import FactorsFileError, apply_layer_scaling, factors_for_model, load_factors_file

TARGET = "temperature"  # the factors-file ``target`` of a temperature search
#: the factors-file ``target`` of a joint search: RoPE factors (``factors``) and temperatures
#: (``temperatures``, ``temperature_curve``) found together; ``lpes`` applies both
JOINT_TARGET = "rope+temperature"
#: the curve GA's default value grid for ``posbias search --target temperature`` (fine steps near 1)
TEMPERATURE_GRID = (0.5, 0.6, 0.7, 0.8, 0.85, 0.9, 0.95, 1.0, 1.05, 1.1, 1.2, 1.3, 1.5, 1.75, 2.0)


def query_module(attn: torch.nn.Module, layer: int) -> torch.nn.Module:
    """The module whose output is the query just before RoPE (``q_norm`` if any, else ``q_proj``)."""
    for name in ("q_norm", "q_proj"):
        mod = getattr(attn, name, None)
        if isinstance(mod, torch.nn.Module):
            return mod
    raise ValueError(f"temperature: layer {layer} attention ({type(attn).__name__}) has no q_proj / q_norm "
                     "(a fused qkv projection is not supported)")


class TemperatureHooks:
    """Forward hooks multiplying the query of each layer with ``t_l != 1`` by ``t_l``."""

    def __init__(self, model, values: Sequence[float]):
        self.values = tuple(float(v) for v in values)
        self._hooks = []
        try:
            for i, (layer, t) in enumerate(zip(get_decoder_layers(model), self.values)):
                if t != 1.0:
                    mod = query_module(layer.self_attn, i)
                    self._hooks.append(mod.register_forward_hook(lambda m, a, out, t=t: out * t))
        except Exception:
            self.remove()
            raise

    def remove(self) -> None:
        for h in self._hooks:
            h.remove()
        self._hooks = []

    def __enter__(self) -> "TemperatureHooks":
        return self

    def __exit__(self, *exc) -> None:
        self.remove()


def check_values(values, n_layers: int) -> tuple[float, ...]:
    """One finite temperature > 0 per layer (one value is used for every layer)."""
    vals = as_list(values, float, "temperature: values")
    if len(vals) == 1:
        vals = vals * n_layers
    if len(vals) != n_layers:
        raise ValueError(f"temperature: {len(vals)} values for a model with {n_layers} decoder layers; "
                         "give one per layer")
    bad = [v for v in vals if not math.isfinite(v) or v <= 0]
    if bad:
        raise ValueError(f"temperature: every value must be a finite number > 0, got {bad[0]}")
    return tuple(vals)


def values_from_file(path, n_layers: int) -> tuple[float, ...]:
    """The per-layer values of a temperature search's factors file, fitted to ``n_layers``."""
    try:
        doc = load_factors_file(str(path), num_layers=n_layers)
    except FactorsFileError as e:
        raise ValueError(f"temperature: {e}") from None
    if doc.get("target") == JOINT_TARGET:
        raise ValueError(f"temperature: {path} holds RoPE factors and temperatures found together "
                         "(a joint search): apply it with lpes@factors=PATH")
    if doc.get("target") != TARGET:
        raise ValueError(f"temperature: {path} holds RoPE factors, not temperatures "
                         "(write one with posbias search --target temperature)")
    return tuple(doc["factors"])


def joint_temperatures(doc: dict, n_layers: int, path="<factors>") -> tuple[float, ...]:
    """The temperatures of a joint search's factors file (``load_factors_file``'s dict), fitted to
    ``n_layers`` (its ``temperature_curve`` re-evaluated for another depth)."""
    temps = doc.get("temperatures")
    if not isinstance(temps, list):
        raise FactorsFileError(f"{path}: a {JOINT_TARGET} file needs the list 'temperatures'")
    fitted = factors_for_model({"factors": temps, "curve": doc.get("temperature_curve")}, n_layers, path=path)
    try:
        return check_values(fitted, n_layers)
    except ValueError as e:
        raise FactorsFileError(f"{path}: {e}") from None


def apply_scaling_and_temperature(model, factors: Sequence[float], temperatures: Sequence[float]) -> ExitStack:
    """Per-layer RoPE factors (LPES) and attention temperatures on one model; closing the returned
    stack removes both."""
    stack = ExitStack()
    try:
        stack.enter_context(apply_layer_scaling(model, factors))
        stack.enter_context(TemperatureHooks(model, temperatures))
    except Exception:
        stack.close()
        raise
    return stack


@register_method("temperature", "attention temperature: scale the query of each layer by t_l before the dot "
                                "product (options t, values, values_file)",
                 aliases=("attention-temperature",))
def apply_temperature(model, t: float = 1.0, values: Sequence[float] | None = None,
                      values_file: str | None = None) -> MethodHandle:
    """Apply per-layer attention temperatures: ``values`` / ``values_file`` if given, else ``t`` everywhere."""
    n = len(get_decoder_layers(model))
    if values is not None and values_file is not None:
        raise ValueError("temperature: give values or values_file, not both")
    if values_file is not None:
        vals = values_from_file(values_file, n)
    else:
        vals = check_values(t if values is None else values, n)
    hooks = TemperatureHooks(model, vals)
    opts = {"values": list(vals), **({"values_file": str(values_file)} if values_file is not None else {})}
    return MethodHandle("temperature", model, remove_fn=hooks.remove, options=opts, state={"hooks": hooks})
