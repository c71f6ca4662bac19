"""Inference-time patches of pretrained RoPE models (no weight change)."""
from posbias.patching.rope_scaling import (
    FactorsFileError,
    ScalingHandle,
    active_scaling,
    apply_factors_file,
    apply_layer_scaling,
    load_factors_file,
    remove_layer_scaling,
    save_factors_file,
)

__all__ = [
    "FactorsFileError", "ScalingHandle", "active_scaling", "apply_factors_file", "apply_layer_scaling",
    "load_factors_file", "remove_layer_scaling", "save_factors_file",
]
