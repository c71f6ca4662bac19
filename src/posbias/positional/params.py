"""Initial values of per-head prior parameters, given as one value for every head or one per head."""
from __future__ import annotations

from typing import Sequence

import torch


def per_head(given: float | Sequence[float] | None, default: torch.Tensor, n_heads: int) -> torch.Tensor:
    """float32 [H] on the CPU: ``default`` when ``given`` is None, else ``given`` (1 or H values)."""
    if given is None:
        return default
    t = torch.as_tensor(given, dtype=torch.float32, device="cpu").flatten()
    if t.numel() == 1:
        return t.expand(n_heads).clone()
    if t.numel() != n_heads:
        raise ValueError(f"expected 1 or {n_heads} initial values, got {t.numel()}")
    return t
