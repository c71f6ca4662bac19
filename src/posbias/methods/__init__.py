"""Position-bias methods behind one registry: ``apply_method(model, name, **options)``.

Methods: ``none``, ``pi`` (one global interpolation factor), ``lpes`` (per-layer factors file),
``ms-poe`` (per-head position interpolation), ``attention-buckets`` (parallel passes with several
RoPE bases, logits mixed), ``moice`` (per-head/token router over RoPE bases), ``positional-hidden``
(scale positional hidden dimensions for the last tokens), ``temperature`` (per-layer attention-logit scale),
``calibration`` (found-in-the-middle: the answer's attention re-weighted by position-calibrated relevance),
``attention-sorting`` (the records re-shown sorted by the attention they receive: a prompt change).
"""
# The built-in methods register themselves when imported (the registry imports none of them).
from posbias.methods import (  # noqa: F401,E402
    attention_buckets,
    attention_sorting,
    calibration,
    lpes,
    moice,
    ms_poe,
    pi,
    positional_hidden,
    temperature,
)
from posbias.methods.registry import (
    METHODS,
    MethodHandle,
    apply_method,
    method_options,
    register_method,
    resolve_method,
    split_variant,
)

__all__ = ["METHODS", "MethodHandle", "apply_method", "method_options", "register_method", "resolve_method",
           "split_variant"]
