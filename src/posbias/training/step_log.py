"""What a BAM training run logs to ``metrics.jsonl``: loss and throughput every ``log_every`` steps
(:class:`StepLog`, with the learned priors' summary), and the probe streak that ends a run early."""
from __future__ import annotations

import time
from pathlib import Path

import torch

from posbias.utils.io import append_jsonl

from .config import TrainConfig
from .distributed import DistInfo, mean_across


class StepLog:
    """Mean loss and throughput since the last log line; rank 0 appends it to ``metrics.jsonl``."""

    def __init__(self, cfg: TrainConfig, info: DistInfo, out: Path):
        self.info, self.out = info, out
        self.tokens_per_step = cfg.batch_size * cfg.grad_accum * cfg.context * info.world_size
        self.t_start = self.t_last = time.perf_counter()
        self.tokens, self.loss_sum, self.n = 0, 0.0, 0

    def add(self, loss: float) -> None:
        self.loss_sum += loss
        self.n += 1
        self.tokens += self.tokens_per_step

    def write(self, done: int, optimizer, gnorm: float, model) -> dict:
        now = time.perf_counter()
        rec = {"step": done, "loss": mean_across(self.loss_sum / self.n, self.info),
               "lr": optimizer.param_groups[0]["lr"], "grad_norm": gnorm,
               "tokens_per_s": self.tokens / max(now - self.t_last, 1e-9), "tokens": done * self.tokens_per_step,
               "elapsed_s": now - self.t_start, **prior_summary(model)}
        if self.info.is_main:
            append_jsonl(self.out / "metrics.jsonl", rec)
        self.t_last, self.tokens, self.loss_sum, self.n = now, 0, 0.0, 0
        return rec


def prior_summary(model) -> dict:
    """Means of the GGD / KERPLE priors' parameters, FIRE's c and threshold L, and the SSMax scales, for the log
    line (empty for other schemes)."""
    out = {}
    priors = getattr(model.model, "priors", None)
    if priors is not None and model.config.pe == "ggd":
        a = torch.stack([p.theta_alpha.detach().float() for p in priors])
        b = torch.stack([p.theta_beta.detach().float() for p in priors])
        out.update(theta_alpha_mean=a.mean().item(), theta_beta_mean=b.mean().item(),
                   theta_beta_min=b.min().item(), theta_beta_max=b.max().item())
    elif priors is not None and model.config.pe.startswith("kerple"):
        r1 = torch.stack([p.r1.detach().float() for p in priors])
        r2 = torch.stack([p.r2.detach().float() for p in priors])
        out.update(r1_mean=r1.mean().item(), r2_mean=r2.mean().item(), r2_min=r2.min().item(),
                   r2_max=r2.max().item())
    elif priors is not None and model.config.pe == "fire":
        out.update(fire_c_mean=torch.cat([p.c().detach() for p in priors]).mean().item(),
                   fire_threshold_mean=torch.cat([p.threshold_value().detach() for p in priors]).mean().item())
    if model.config.normaliser == "ssmax":
        s = torch.stack([layer.self_attn.ssmax.s.detach().float() for layer in model.model.layers])
        out["ssmax_s_mean"] = s.mean().item()
    return out


def probe_reached(probe: dict, target: float, tasks: tuple[str, ...]) -> bool:
    """Every one of ``tasks`` has its exact match (``<task>_em`` in ``probe``) >= ``target``."""
    return all((probe.get(f"{t}_em") or 0) >= target for t in tasks)


def probe_streak(records: list[dict], target: float, tasks: tuple[str, ...] = ("passkey",)) -> int:
    """How many of the last probes in ``records`` (``metrics.jsonl``) reached ``target`` on every one
    of ``tasks`` in a row."""
    streak = 0
    for r in records:
        if r.get(f"{tasks[0]}_em") is not None:
            streak = streak + 1 if probe_reached(r, target, tasks) else 0
    return streak
