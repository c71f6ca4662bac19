"""Optimizer and learning-rate schedule of a BAM training run: warmup, then cosine, constant or
warmup-stable-decay (:func:`lr_lambda`); weight decay only on 2-D weights (:func:`param_groups`)."""
from __future__ import annotations

import math

import torch

from .config import TrainConfig


def lr_lambda(step: int, *, steps: int, warmup: int, min_ratio: float, schedule: str = "cosine",
              decay_fraction: float = 0.2) -> float:
    """Multiplier of the base lr at ``step``, after a linear warmup of ``warmup`` steps:

    - ``cosine``: from 1 down to ``min_ratio`` at ``steps``. The rate at every step depends on
      ``steps``, so a run that stops early at a probe target trains differently under another cap.
    - ``constant``: 1 to the end. Independent of ``steps``: runs with caps 4,000 and 8,000 are the
      same run until the first one ends, so the cap no longer decides what a stopped run learned.
    - ``wsd`` (warmup-stable-decay; Hu et al. 2024, MiniCPM): 1 until the last ``decay_fraction``
      of ``steps``, then linear to ``min_ratio``; independent of ``steps`` until that decay starts.
    """
    warmup = min(warmup, steps)
    if step < warmup:
        return (step + 1) / warmup
    if schedule == "constant":
        return 1.0
    if schedule == "wsd":
        decay_start = max(warmup, steps - round(decay_fraction * steps))
        progress = (step - decay_start) / max(1, steps - decay_start)
        return 1.0 - (1.0 - min_ratio) * min(max(progress, 0.0), 1.0)
    progress = (step - warmup) / max(1, steps - warmup)
    return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * min(progress, 1.0)))


def param_groups(model, cfg: TrainConfig) -> list[dict]:
    """decay: 2-D weights; no_decay: norms, biases; prior: positional priors + SSMax (no decay)."""
    prior_ids = {id(p) for p in model.prior_parameters()}
    decay, no_decay, prior = [], [], []
    for _, p in model.named_parameters():
        if not p.requires_grad:
            continue
        if id(p) in prior_ids:
            prior.append(p)
        elif p.dim() >= 2:
            decay.append(p)
        else:
            no_decay.append(p)
    groups = [{"params": decay, "weight_decay": cfg.weight_decay, "name": "decay"},
              {"params": no_decay, "weight_decay": 0.0, "name": "no_decay"}]
    if prior:
        groups.append({"params": prior, "weight_decay": 0.0, "name": "prior",
                       "lr": cfg.prior_lr if cfg.prior_lr is not None else cfg.lr})
    return groups


def make_optimizer(model, cfg: TrainConfig) -> torch.optim.Optimizer:
    groups = param_groups(model, cfg)
    if cfg.optimizer == "radam":
        return torch.optim.RAdam(groups, lr=cfg.lr, betas=tuple(cfg.betas), decoupled_weight_decay=True)
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=tuple(cfg.betas))


def make_scheduler(optimizer: torch.optim.Optimizer, cfg: TrainConfig) -> torch.optim.lr_scheduler.LambdaLR:
    """The learning-rate scheduler of ``cfg.schedule`` (:func:`lr_lambda`)."""
    lam = lambda s: lr_lambda(s, steps=cfg.steps, warmup=cfg.warmup_steps, min_ratio=cfg.min_lr_ratio,  # noqa: E731
                              schedule=cfg.schedule, decay_fraction=cfg.decay_fraction)
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lam)
