"""LPES: per-layer RoPE scaling factors read from a factors file (see posbias.patching.rope_scaling)."""
from __future__ import annotations

from pathlib import Path

from posbias.methods.registry import MethodHandle, register_method
from posbias.patching.rope_scaling import apply_factors_file, load_factors_file


@register_method("lpes", "layer-specific positional embedding scaling from a factors file (option factors=PATH)")
def apply_lpes(model, factors: str | None = None) -> MethodHandle:
    if factors is None:
        raise ValueError("lpes: option factors=PATH (a factors file written by the LPES search) is required")
    path = Path(str(factors)).expanduser()
    if not path.exists():
        raise ValueError(f"lpes: factors file {path} does not exist")

    if load_factors_file(path).get("target", "rope") != "rope":  # e.g. a temperature search's curve
        raise ValueError(f"lpes: {path} holds {load_factors_file(path)['target']} values, not RoPE factors")
    inner = apply_factors_file(model, path)
    return MethodHandle("lpes", model, remove_fn=inner.remove, options={"factors": str(path)}, state={"patch": inner})
