"""Position interpolation (PI): one global factor, positions m -> m / factor in every layer."""
from __future__ import annotations

from posbias.architecture.layers import get_decoder_layers
from posbias.methods.registry import MethodHandle, register_method
from posbias.patching.rope_scaling import apply_layer_scaling


@register_method("pi", "position interpolation with one global factor (option factor)",
                 aliases=("position-interpolation",))
def apply_pi(model, factor: float = 1.0) -> MethodHandle:
    try:
        factor = float(factor)
    except (TypeError, ValueError):
        raise ValueError(f"pi: factor must be a number, got {factor!r}") from None
    if not factor > 0:
        raise ValueError(f"pi: factor must be > 0, got {factor}")

    n = len(get_decoder_layers(model))
    inner = apply_layer_scaling(model, [factor] * n)
    return MethodHandle("pi", model, remove_fn=inner.remove, options={"factor": factor}, state={"patch": inner})
