"""LPES: per-layer RoPE scaling factors read from a factors file (see posbias.patching.rope_scaling).

A factors file of a joint search (``posbias search --target rope+temperature``) also holds per-layer
attention temperatures found together with the factors; both are applied (:mod:`posbias.methods.temperature`).
"""
from __future__ import annotations

from pathlib import Path

from posbias.architecture.layers import get_decoder_layers
from posbias.methods.registry import MethodHandle, register_method
from posbias.methods.temperature import JOINT_TARGET, apply_scaling_and_temperature, joint_temperatures
from posbias.patching.rope_scaling import FactorsFileError, apply_factors_file, load_factors_file


@register_method("lpes", "layer-specific positional embedding scaling from a factors file (option factors=PATH)")
def apply_lpes(model, factors: str | None = None) -> MethodHandle:
    if factors is None:
        raise ValueError("lpes: option factors=PATH (a factors file written by the LPES search) is required")
    path = Path(str(factors)).expanduser()
    if not path.exists():
        raise ValueError(f"lpes: factors file {path} does not exist")
    target = load_factors_file(path).get("target", "rope")
    if target == JOINT_TARGET:
        return _apply_joint(model, path)
    if target != "rope":  # e.g. a temperature search's curve
        raise ValueError(f"lpes: {path} holds {target} values, not RoPE factors")
    inner = apply_factors_file(model, path)
    return MethodHandle("lpes", model, remove_fn=inner.remove, options={"factors": str(path)}, state={"patch": inner})


def _apply_joint(model, path: Path) -> MethodHandle:
    """The RoPE factors and the temperatures of a joint search's file, each fitted to the model's depth."""
    n = len(get_decoder_layers(model))
    doc = load_factors_file(path, num_layers=n)
    try:
        temps = joint_temperatures(doc, n, path)
    except FactorsFileError as e:
        raise ValueError(f"lpes: {e}") from None
    stack = apply_scaling_and_temperature(model, doc["factors"], temps)
    return MethodHandle("lpes", model, remove_fn=stack.close, options={"factors": str(path)},
                        state={"patch": stack, "temperatures": temps})
