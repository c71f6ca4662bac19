"""BAM decoder: ``BamConfig`` / ``BamForCausalLM`` (registered with AutoConfig / AutoModelForCausalLM
as ``model_type="posbias-bam"`` on import).

>>> from posbias.bam import BamConfig, BamForCausalLM
>>> model = BamForCausalLM(BamConfig.from_preset("tiny", pe="ggd", normaliser="ssmax", vocab_size=49152))
"""
from transformers import AutoConfig, AutoModel, AutoModelForCausalLM

from .config import NORMALISERS, PRESETS, BamConfig
from .model import BamForCausalLM, BamModel, BamPreTrainedModel

AutoConfig.register(BamConfig.model_type, BamConfig, exist_ok=True)
AutoModel.register(BamConfig, BamModel, exist_ok=True)
AutoModelForCausalLM.register(BamConfig, BamForCausalLM, exist_ok=True)


def build_model(preset: str = "tiny", **overrides) -> BamForCausalLM:
    """A randomly initialised :class:`BamForCausalLM` of ``preset`` size with config ``overrides``."""
    return BamForCausalLM(BamConfig.from_preset(preset, **overrides))


__all__ = ["BamConfig", "BamForCausalLM", "BamModel", "BamPreTrainedModel", "PRESETS", "NORMALISERS", "build_model"]
