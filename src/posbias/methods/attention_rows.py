"""The attention weights of chosen query rows, computed by the model's own eager attention function.

A forward pass runs its attention kernel as the model chose it (SDPA, flash, eager) and keeps no weights.
Where posbias needs the weights of a few rows (the attention diagnostic: the last prompt token; attention
calibration: the answer rows), it evaluates the modeling file's ``eager_attention_forward`` on those query rows
alone, with the same keys, values, mask rows and scaling: ``(B, H, rows, keys)``, never the ``L x L`` matrix.
"""
from __future__ import annotations

import sys
from typing import Callable

import torch

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
