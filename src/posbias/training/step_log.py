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
    """The ``metrics.jsonl`` line of every ``log_every`` steps: the mean loss of those steps
    (``loss_steps``: how many steps the mean covers), the throughput since the previous line, the
    learning rate, gradient norm and the priors' summary; rank 0 appends it.

    The line that ends a run early (``stop_after``, ``final_step``) averages the steps since the last
    regular line and does not restart the window, and the window travels in the checkpoint
    (:meth:`window`, restored by passing it back): the first regular line after a resume averages
    the same ``log_every`` steps as in an uninterrupted run.
    """

    def __init__(self, cfg: TrainConfig, info: DistInfo, out: Path, window: dict | None = None):
        self.info, self.out = info, out
        self.tokens_per_step = cfg.batch_size * cfg.grad_accum * cfg.context * info.world_size
        self.t_start = self.t_last = time.perf_counter()
        self.tokens = 0
        self.loss_sum, self.n = (float(window["loss_sum"]), int(window["steps"])) if window else (0.0, 0)

    def add(self, loss: float) -> None:
        self.loss_sum += loss
        self.n += 1
        self.tokens += self.tokens_per_step

    def write(self, done: int, optimizer, gnorm: float, model, *, restart: bool = True) -> dict:
        """Append the line of step ``done``; ``restart``: a regular line, whose window ends here."""
        now = time.perf_counter()
        rec = {"step": done, "loss": mean_across(self.loss_sum / self.n, self.info), "loss_steps": self.n,
               "lr": optimizer.param_groups[0]["lr"], "grad_norm": gnorm,
               "tokens_per_s": self.tokens / max(now - self.t_last, 1e-9), "tokens": done * self.tokens_per_step,
               "elapsed_s": now - self.t_start, **prior_summary(model)}
        if self.info.is_main:
            append_jsonl(self.out / "metrics.jsonl", rec)
        self.t_last, self.tokens = now, 0
        if restart:
            self.loss_sum, self.n = 0.0, 0
        return rec

    def window(self) -> dict:
        """The loss window so far, for the checkpoint (every rank calls it: the sum is averaged
        across ranks, so that each rank's restored share gives the same mean)."""
        return {"loss_sum": mean_across(self.loss_sum, self.info), "steps": self.n}


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
