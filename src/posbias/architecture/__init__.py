"""What posbias reads off a decoder architecture, below everything that patches or loads models:
where the decoder layers are (``layers``) and each layer's RoPE (``rope_layout``)."""
from posbias.architecture.layers import SUPPORTED_HINT, ModelLoadError, get_decoder_layers
from posbias.architecture.rope_layout import RopeLayout, RopeLayoutError, rope_layout

__all__ = ["SUPPORTED_HINT", "ModelLoadError", "get_decoder_layers", "RopeLayout", "RopeLayoutError", "rope_layout"]
