"""Scalable-Softmax (SSMax; Nakanishi 2025, "Scalable-Softmax Is Superior for Attention").

``SSMax(z)_i = softmax((s * log n) * z)``: the logits of a query that sees ``n`` keys are scaled
by ``s_h * log n`` (``s_h`` learnable per head, init 1) so the attention does not flatten as the
context grows. For causal attention ``n`` is the number of keys *this* query may attend to
(``n_i``, counted inside its own document when documents are packed), not the row length.
In BAM (Bianchessi et al. 2025) the order is ``(q k^T / sqrt(d) + prior) * (s_h log n_i)``, then
the mask, then a float32 softmax; :func:`posbias.attention.attend` follows it.
"""
from __future__ import annotations

import torch
import torch.nn as nn

SCOPES = ("all", "content")


class SSMax(nn.Module):
    """Per-head SSMax scale ``s`` (float32 [H], init ``init``).

    ``scope``: what ``s_h log n_i`` multiplies: ``"all"`` the content logits plus the positional
    prior (BAM's order), ``"content"`` the content logits only, the prior added after (an ablation).
    """

    def __init__(self, n_heads: int, init: float = 1.0, scope: str = "all"):
        super().__init__()
        if scope not in SCOPES:
            raise ValueError(f"unknown SSMax scope {scope!r}; known: {', '.join(SCOPES)}")
        self.n_heads = n_heads
        self.scope = scope
        self.init = float(init)
        self.s = nn.Parameter(torch.full((n_heads,), self.init))
        self.max_keys: int | None = None  # an evaluation knob (not saved): counts above it count as it

    @torch.no_grad()
    def reset_parameters(self) -> None:
        self.s.fill_(self.init)

    def multiplier(self, n_keys: torch.Tensor) -> torch.Tensor:
        """``n_keys``: [b, i] (or [i]) visible-key counts -> float32 [b, H, i, 1] = ``s_h * log n_i``.

        Counts below 1 (a query that sees nothing, e.g. padding) are treated as 1 (log = 0); with
        ``max_keys`` set, counts above it as ``max_keys`` (e.g. the training context: the multiplier
        then never leaves the range it had in training; an ablation, not SSMax).
        """
        if n_keys.dim() == 1:
            n_keys = n_keys[None]
        logn = torch.log(n_keys.to(torch.float32).clamp(min=1.0, max=self.max_keys))  # [b, i]
        return self.s.float()[None, :, None, None] * logn[:, None, :, None]

    def extra_repr(self) -> str:
        return f"n_heads={self.n_heads}, init={self.init:g}, scope={self.scope}"
