"""The attention weights of chosen query rows, computed by the model's own eager attention function.

A forward pass runs its attention kernel as the model chose it (SDPA, flash, eager) and keeps no weights.
Where posbias needs the weights of a few rows (the attention diagnostic: the last prompt token; attention
calibration: the answer rows), it evaluates the modeling file's ``eager_attention_forward`` on those query rows
alone, with the same keys, values, mask rows and scaling: ``(B, H, rows, keys)``, never the ``L x L`` matrix.
"""
from __future__ import annotations

import copy
import sys
import weakref
from typing import Callable

import torch
from transformers import AttentionInterface

from posbias.architecture.layers import get_decoder_layers
from posbias.methods.rope_attention import float_mask

KERNELS = ("eager", "sdpa", "flash_attention_2", "flex_attention")  # the model's own kernels a wrapper keeps


def eager_function(module) -> Callable | None:
    """The modeling file's ``eager_attention_forward`` of an attention module (None: it has none)."""
    return getattr(sys.modules[type(module).__module__], "eager_attention_forward", None)


def row_mask(mask, q_len: int, kv: int, dtype, device, batch: int) -> torch.Tensor | None:
    """The additive float mask ``(B, 1, q, kv)`` of an attention call, from the model's own format (float,
    boolean, or None for plain causal attention); None when there is nothing to mask (one query)."""
    out = float_mask(mask, q_len, kv, dtype, device)
    return None if out is None else out.expand(batch, 1, q_len, kv)


def weights_at(module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attention_mask,
               rows: torch.Tensor, kwargs: dict) -> torch.Tensor:
    """Attention weights ``(B, H, R, kv)`` of query rows ``rows`` (B, R) (indices into the call's ``q`` queries)
    of ``query`` (B, H, q, d) over ``key`` / ``value`` (B, KV, kv, d), by ``module``'s eager function with the
    call's own mask rows, scaling and options (GQA and soft-capping as the model does them)."""
    batch, q_len, kv = query.shape[0], query.shape[2], key.shape[2]
    index = rows.to(query.device)
    q = torch.gather(query, 2, index[:, None, :, None].expand(-1, query.shape[1], -1, query.shape[3]))
    mask = row_mask(attention_mask, q_len, kv, query.dtype, query.device, batch)
    if mask is not None:
        mask = torch.gather(mask, 2, index[:, None, :, None].expand(-1, 1, -1, kv))
    extra = {k: v for k, v in kwargs.items() if k != "dropout"}
    _, weights = eager_function(module)(module, q, key, value, mask, dropout=0.0, **extra)
    return weights


class AttentionOverride:
    """Every decoder layer's attention module of ``model`` calls ``dispatch`` (registered with transformers'
    ``AttentionInterface`` as ``name``) instead of its kernel, through a private copy of its config; the
    module's own kernel stays at hand (:meth:`native`) and ``owners[module]`` is ``owner`` meanwhile.
    :meth:`remove` restores every config. A module whose kernel is not the model's own (another method's
    override) is refused with ``refused`` and the layer's kernel name."""

    def __init__(self, model, name: str, dispatch: Callable, owners: weakref.WeakKeyDictionary, owner,
                 refused: str):
        AttentionInterface.register(name, dispatch)
        self._owners, self._saved, self._native = owners, [], {}
        for layer in get_decoder_layers(model):
            attn = layer.self_attn
            implementation = attn.config._attn_implementation
            if implementation not in KERNELS or eager_function(attn) is None or attn in owners:
                self.remove()
                raise ValueError(f"{refused} (layer {attn.layer_idx} uses {implementation!r})")
            self._native[id(attn)] = AttentionInterface().get_interface(implementation, eager_function(attn))
            self._saved.append((attn, attn.config))
            cfg = copy.copy(attn.config)
            cfg.__dict__["_attn_implementation_internal"] = name
            attn.config = cfg
            owners[attn] = owner

    def native(self, module) -> Callable:
        """The kernel ``module`` calls without the override (SDPA, eager, ...)."""
        return self._native[id(module)]

    def remove(self) -> None:
        for attn, cfg in reversed(self._saved):
            attn.config = cfg
            self._owners.pop(attn, None)
        self._saved = []
