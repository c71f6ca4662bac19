"""Model loading (``load_model``); the architecture helpers live in ``posbias.architecture`` (re-exported)."""
from posbias.models.loader import (
    ModelLoadError,
    check_rope_model,
    get_decoder_layers,
    get_rotary_modules,
    load_model,
    model_identity,
)
from posbias.models.options import LoadOptions

__all__ = ["LoadOptions", "ModelLoadError", "check_rope_model", "get_decoder_layers", "get_rotary_modules",
           "load_model",
           "model_identity"]
