"""How long a study will take, said before it starts: a few timed steps of the study's own model.

Training: one optimizer step of a fresh model of the study's preset and vocabulary on a random batch of
the training shape (``batch_size x context``, times ``grad_accum``), timed with the torch threads each
training process will have, times the step cap, per round of ``train_workers`` schemes. A run with a
probe target usually stops before its cap, so this is an upper bound. Evaluation: a forward pass timed at
two lengths and fitted as ``a L + b L^2`` (linear layers + attention), summed over the grid's instances and
the perplexity windows. Rough by design (a few seconds of timing, a fit extrapolated to the far lengths);
the live progress of each step is what to trust once it runs.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import torch

from posbias.bam import BamForCausalLM
from posbias.study.config import StudyConfig
from posbias.study.grid import grid_views
from posbias.study.training import model_dir_name, train_config
from posbias.training.config import build_bam_config
from posbias.utils.devices import resolve_device
from posbias.utils.threads import thread_budget
from posbias.utils.workers import threads_per_worker

TIMED_STEPS = 2  # after one untimed warm-up step
SLIDING_WINDOW_FACTOR = 2  # the sliding perplexity runs twice the windows (stride = context / 2)


@dataclass(frozen=True)
class StudyEstimate:
    """Seconds a study is expected to take (``train_s``: every scheme still to train run to its step
    cap; ``eval_s``: every grid cell and perplexity window of every scheme), and what they count."""

    train_s: float
    eval_s: float
    schemes_to_train: int
    step_s: float
    forwards: int

    def describe(self) -> str:
        """One line for the console."""
        train = (f"training {self.schemes_to_train} scheme(s) at most {_minutes(self.train_s)} "
                 f"({self.step_s * 1e3:.0f} ms a step; a probe target usually stops it sooner)"
                 if self.schemes_to_train else "every model already trained")
        return (f"[study] estimate: {train}; evaluation about {_minutes(self.eval_s)} for the whole grid "
                f"({self.forwards:,} forward passes; cells already scored are skipped); rough, timed just now")


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:.0f} min" if seconds >= 90 else f"{seconds:.0f} s"


def estimate_study(cfg: StudyConfig, tokenizer, to_train: Sequence[str],
                   passkey_heldout: str | None = None) -> StudyEstimate:
    """The :class:`StudyEstimate` of ``cfg`` with ``to_train`` schemes still to train, timed on a fresh
    model of ``cfg.schemes[0]`` on ``cfg.device`` (the schemes of one study differ in their positional
    bias only)."""
    scheme = (list(to_train) or cfg.schemes)[0]
    train_cfg = train_config(cfg, scheme, Path(cfg.out) / "models" / model_dir_name(scheme))
    model = BamForCausalLM(build_bam_config(train_cfg, tokenizer)).to(resolve_device(cfg.device))
    workers = max(1, min(cfg.train_workers, len(to_train)))
    step_s = 0.0
    if to_train:
        with torch_threads(threads_per_worker(workers) if workers > 1 else thread_budget()):
            step_s = train_cfg.grad_accum * time_training_step(model, train_cfg.batch_size, train_cfg.context)
    counts = forward_counts(cfg, passkey_heldout)
    a, b = fit_forward_time(model, (cfg.train_context, min(8 * cfg.train_context, max(counts, default=1))))
    eval_s = len(cfg.schemes) * sum(count * (a * length + b * length ** 2) for length, count in counts.items())
    return StudyEstimate(train_s=math.ceil(len(to_train) / workers) * train_cfg.steps * step_s, eval_s=eval_s,
                         schemes_to_train=len(to_train), step_s=step_s,
                         forwards=len(cfg.schemes) * sum(counts.values()))


def forward_counts(cfg: StudyConfig, passkey_heldout: str | None = None) -> dict[int, int]:
    """``{length: forward passes}`` of one scheme's evaluation: one per grid instance and scoring mode of
    each view (``n_at(length) x depths`` instances per length), one per perplexity window (non-overlapping
    and sliding on the held-out text, and the training text at the training context)."""
    views = grid_views(niah=cfg.niah, niah_options=cfg.niah_options, passkey_essay=cfg.passkey_essay,
                       niah_essay=cfg.niah_essay, passkey_heldout=passkey_heldout if cfg.passkey_heldout else None)
    out = {length: len(views) * len(cfg.modes) * cfg.n_at(length) * len(cfg.depths) for length in cfg.lengths}
    tokens = cfg.ppl_eval_tokens or 0
    for context in cfg.ppl_contexts:
        out[context] = out.get(context, 0) + math.ceil(tokens / context) * (1 + SLIDING_WINDOW_FACTOR)
    if cfg.ppl_contexts:
        out[cfg.train_context] = out.get(cfg.train_context, 0) + math.ceil(tokens / cfg.train_context)
    return out


def time_training_step(model: torch.nn.Module, batch_size: int, context: int) -> float:
    """Seconds of one optimizer step (forward, backward, AdamW) on random ids ``[batch_size, context]``,
    after one untimed step; the model's weights are left changed (a throw-away model)."""
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    device = next(model.parameters()).device
    ids = torch.randint(0, model.config.vocab_size, (batch_size, context), device=device)

    def step() -> None:
        model(input_ids=ids, labels=ids, use_cache=False).loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    step()
    _sync(device)
    start = time.perf_counter()
    for _ in range(TIMED_STEPS):
        step()
    _sync(device)
    return (time.perf_counter() - start) / TIMED_STEPS


@torch.no_grad()
def fit_forward_time(model: torch.nn.Module, lengths: tuple[int, int]) -> tuple[float, float]:
    """``(a, b)`` with ``a L + b L^2`` the seconds of one forward pass of batch 1 at ``L`` tokens, from
    timings at the two ``lengths`` (both >= 0; ``b`` = 0 when the lengths coincide)."""
    model.eval()
    short, long = sorted(lengths)
    t_short, t_long = (_time_forward(model, length) for length in (short, long))
    if long == short:
        return t_short / short, 0.0
    b = max(0.0, (t_long / long - t_short / short) / (long - short))
    return max(0.0, t_short / short - b * short), b


def _time_forward(model: torch.nn.Module, length: int) -> float:
    device = next(model.parameters()).device
    ids = torch.randint(0, model.config.vocab_size, (1, length), device=device)
    model(input_ids=ids, use_cache=False, logits_to_keep=1)
    _sync(device)
    start = time.perf_counter()
    model(input_ids=ids, use_cache=False, logits_to_keep=1)
    _sync(device)
    return time.perf_counter() - start


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class torch_threads:
    """``with torch_threads(n):`` torch's intra-op threads set to ``n`` inside, restored after."""

    def __init__(self, n: int):
        self.n, self.before = n, torch.get_num_threads()

    def __enter__(self) -> None:
        torch.set_num_threads(self.n)

    def __exit__(self, *exc) -> None:
        torch.set_num_threads(self.before)
