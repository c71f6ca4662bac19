"""No positional encoding (NoPE; Kazemnejad et al. 2023, "The Impact of Positional Encoding on
Length Generalization in Transformers"). In BAM terms: a uniform positional prior. Order comes
from the causal mask alone."""
from __future__ import annotations

from .registry import register_scheme

register_scheme("nope", "none", lambda **_: None, "no positional information (uniform prior)")
