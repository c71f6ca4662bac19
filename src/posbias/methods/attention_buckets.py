"""Attention Buckets (Fortify the Shortest Stave, Chen et al. 2024): parallel passes with several
RoPE bases whose next-token logits are mixed.

The batch is repeated once per base (copy-major: rows ``[c * B + i]`` are copy ``c`` of row ``i``)
and the rotary embedding gives every row the ``inv_freq`` of its copy's base, so the single KV cache
of the repeated batch is one cache per base. At every position the logits are mixed with weights
``softmax_b(max_v logits_b)``: ``final = sum_b w_b * logits_b``.

Default bases: the paper's 10000..28000 step 3000 relative to theta 10000, scaled to the model's own
theta: ``theta * [1.0, 1.3, ..., 2.8]``.
"""
from __future__ import annotations

import inspect
from typing import Sequence

import torch
from transformers.modeling_outputs import CausalLMOutputWithPast

from posbias.architecture.layers import cache_of
from posbias.architecture.rope_layout import rope_layout
from posbias.methods import rope_attention as A
from posbias.methods.registry import MethodHandle, as_list, register_method

DEFAULT_MULTIPLIERS = (1.0, 1.3, 1.6, 1.9, 2.2, 2.5, 2.8)


def mix_logits(logits: torch.Tensor) -> torch.Tensor:
    """(n_bases, B, T, V) -> (B, T, V): ``sum_b softmax_b(max_v logits_b) * logits_b``."""
    w = torch.softmax(logits.float().amax(dim=-1), dim=0)  # (n_bases, B, T)
    return (w[..., None] * logits.float()).sum(0).to(logits.dtype)


class AttentionBucketsModel:
    """Callable with the model's scoring signature that runs the parallel passes and mixes logits.

    The returned ``past_key_values`` belongs to the repeated batch (n_bases x B rows): pass it back
    unchanged with the next B-row inputs.
    """

    def __init__(self, model, multipliers: Sequence[float]):
        self.base_model = model
        self.multipliers = [float(m) for m in multipliers]
        self.layout = rope_layout(model)
        self._rotaries = [self.layout.rotary]
        params = inspect.signature(type(model).forward).parameters
        self._cache_arg = "cache" if "cache" in params else "past_key_values"

    def __getattr__(self, name):  # config, device, dtype, generation_config, ...
        if name in ("base_model", "__setstate__"):
            raise AttributeError(name)
        return getattr(self.base_model, name)

    def forward(self, *args, **kwargs):
        return self(*args, **kwargs)

    def __call__(self, input_ids=None, attention_mask=None, position_ids=None, past_key_values=None,
                 use_cache=None, logits_to_keep=0, cache=None, **kwargs):

        if cache is not None and past_key_values is None:
            past_key_values = cache
        if input_ids is None:
            raise ValueError("attention-buckets: input_ids is required")
        n, (b, t) = len(self.multipliers), input_ids.shape
        if position_ids is None:
            past = past_key_values.get_seq_length() if past_key_values is not None else 0
            position_ids = (torch.arange(t, device=input_ids.device) + past)[None].expand(b, t)
        rep = lambda x: None if x is None else x.repeat(n, *([1] * (x.dim() - 1)))  # noqa: E731
        saved = [(rot, rot.__dict__.get("forward")) for rot in self._rotaries]
        try:
            for rot in self._rotaries:
                rot.forward = self._rotary_forward(rot, b)
            cache_kw = {self._cache_arg: past_key_values} if past_key_values is not None else {}
            out = self.base_model(input_ids=rep(input_ids), attention_mask=rep(attention_mask),
                                  position_ids=rep(position_ids), use_cache=use_cache,
                                  logits_to_keep=logits_to_keep, **cache_kw, **kwargs)
        finally:
            for rot, fwd in saved:
                rot.__dict__.pop("forward", None)
                if fwd is not None:
                    rot.forward = fwd
        logits = out.logits
        mixed = mix_logits(logits.view(n, b, *logits.shape[1:]))
        return CausalLMOutputWithPast(logits=mixed, cache=cache_of(out))

    def _rotary_forward(self, rot, b: int):
        """The rotary module's forward for the repeated batch: copy ``c`` gets ``theta * multipliers[c]``
        of the layer type it is asked for, in the model's own pairing (rotate-half or interleaved)."""
        n = len(self.multipliers)
        by_type = {lr.layer_type: lr for lr in self.layout.layers}

        def rows(layer_type):
            rope = by_type[layer_type]
            inv = self.layout.inv_freq(layer_type)
            stacked = torch.stack([A.base_inv_freq(inv, rope.theta, rope.theta * m) for m in self.multipliers])
            return stacked.repeat_interleave(b, dim=0), rope  # (n * B, d/2), copy-major

        table = {lt: rows(lt) for lt in by_type}

        def forward(x, position_ids, layer_type=None):
            inv_rows, rope = table[layer_type]
            pid = position_ids
            if pid.shape[0] != n * b:
                pid = pid.expand(n * b, pid.shape[-1])
            return A.cos_sin(pid, inv_rows.to(x.device), rope.attention_scaling, x.dtype, rope.interleaved)

        return forward


@register_method("attention-buckets", "Attention Buckets: parallel passes with several RoPE bases, logits "
                                      "mixed by softmax of their max (options bases, multipliers)",
                 aliases=("buckets", "attention_buckets", "attnbuckets"))
def apply_attention_buckets(model, bases: Sequence[float] | None = None,
                            multipliers: Sequence[float] | None = None) -> MethodHandle:
    """Args:
        bases: absolute RoPE bases; default ``theta * multipliers``.
        multipliers: relative bases (default 1.0, 1.3, ..., 2.8).
    """
    thetas = sorted(set(rope_layout(model).thetas.values()))
    if bases is None:
        mult = as_list(multipliers, float, "attention-buckets: multipliers") or list(DEFAULT_MULTIPLIERS)
    elif len(thetas) > 1:
        raise ValueError(f"attention-buckets: {type(model).__name__} uses several RoPE bases ({thetas}); give "
                         "multipliers of each layer's own base, not absolute bases")
    else:
        mult = [x / thetas[0] for x in as_list(bases, float, "attention-buckets: bases")]
    if not mult:
        raise ValueError("attention-buckets: need at least one base")
    if any(not x > 0 for x in mult):
        raise ValueError(f"attention-buckets: bases must be > 0, got {mult}")
    wrapper = AttentionBucketsModel(model, mult)
    opts = {"multipliers": mult}
    if len(thetas) == 1:
        opts["bases"] = [thetas[0] * m for m in mult]
    return MethodHandle("attention-buckets", model, model=wrapper, remove_fn=lambda: None, options=opts)
