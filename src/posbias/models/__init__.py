"""Model loading (``load_model``) and architecture helpers."""
from posbias.models.loader import (
    ModelLoadError,
    check_rope_model,
    get_decoder_layers,
    get_rotary_modules,
    load_model,
)

__all__ = ["ModelLoadError", "check_rope_model", "get_decoder_layers", "get_rotary_modules", "load_model"]
