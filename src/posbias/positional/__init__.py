"""Positional schemes: RoPE, sinusoidal, NoPE, ALiBi, GGD-BAM, KERPLE (log, power) and FIRE, registered by name.

>>> from posbias.positional import get_scheme
>>> spec = get_scheme("ggd")        # spec.kind == "bias"
>>> bias = spec.build(num_heads=16)  # GGDBias; bias(q_pos, k_pos) -> [16, i, j]
"""
from . import nope as _nope  # noqa: F401  (registers "nope")
from .alibi import ALiBiBias, alibi_slopes
from .fire import FIREBias
from .ggd import MAX_LOG_MAGNITUDE, GGDBias
from .kerple import KerpleBias, KerpleLogBias, KerplePowerBias
from .registry import KINDS, SCHEMES, SchemeSpec, get_scheme, project_parameters, register_scheme
from .rope import RotaryEmbedding
from .sinusoidal import SinusoidalEmbedding

__all__ = ["KINDS", "SCHEMES", "SchemeSpec", "get_scheme", "register_scheme", "RotaryEmbedding",
           "SinusoidalEmbedding", "ALiBiBias", "alibi_slopes", "GGDBias", "MAX_LOG_MAGNITUDE", "KerpleBias",
           "KerpleLogBias", "KerplePowerBias", "FIREBias", "project_parameters"]
