"""Pre-training loop for BAM decoders: :class:`TrainConfig` and :func:`train`.

Warmup, then a cosine to ``min_lr_ratio`` x lr over the run, a constant rate, or warmup-stable-decay
(:func:`lr_lambda`), gradient clipping, weight decay only on 2-D
weights (not on norms, positional priors or SSMax scales), bf16 autocast on CUDA, DDP under
torchrun, atomic checkpoints (model, optimizer, scheduler, RNG, step = data position) and an
exact ``resume``: a run killed after a checkpoint and resumed ends with the same weights as an
uninterrupted one. Writes ``config.json``, ``metrics.jsonl``, ``checkpoint.pt`` and the final
model (``save_pretrained``) under ``out/final``.
"""
from __future__ import annotations

import dataclasses
import io
import json
import math
import random
import time
import warnings
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from posbias.utils.io import append_jsonl, atomic_write_bytes, atomic_write_text, read_jsonl
from posbias.utils.run_folder import prepare_run_dir

from .data import PackedDataset, check_passkey_haystack, load_texts, load_tokenizer
from .probe import PROBE_TASKS, probe_docs, run_probes
from .tokenizer import resolve_tokenizer_spec
from .distributed import DistInfo, barrier, cleanup, init_distributed, mean_across

OPTIMIZERS = ("adamw", "radam")
SCHEDULES = ("cosine", "constant", "wsd")
PRECISIONS = ("auto", "bf16", "fp32")
CHECKPOINT = "checkpoint.pt"
# settings that must match when resuming a run folder
RESUME_KEYS = ("pe", "ssmax", "preset", "model_overrides", "context", "batch_size", "grad_accum", "lr", "prior_lr",
               "min_lr_ratio", "warmup_steps", "schedule", "decay_fraction", "weight_decay", "betas", "grad_clip",
               "optimizer", "seed", "corpus", "tokenizer", "passkey_rate", "niah_rate", "passkey_haystack",
               "niah_haystack", "steps")


@dataclass
class TrainConfig:
    """Settings of one training run (all JSON-serialisable; stored in ``out/config.json``)."""

    out: str = "runs/bam"
    pe: str = "ggd"
    ssmax: bool = False
    preset: str = "tiny"
    model_overrides: dict = field(default_factory=dict)  # BamConfig fields, e.g. {"ggd_init": "alibi"}
    steps: int = 1000
    context: int = 512
    batch_size: int = 8  # sequences per optimizer step and process (x grad_accum)
    grad_accum: int = 1
    lr: float = 1e-3
    prior_lr: float | None = None  # own lr for priors / SSMax scales (default: lr)
    min_lr_ratio: float = 0.1
    warmup_steps: int = 100
    schedule: str = "cosine"  # cosine (to min_lr_ratio at steps) | constant | wsd (see lr_lambda)
    decay_fraction: float = 0.2  # wsd: the last fraction of steps that decays to min_lr_ratio
    weight_decay: float = 0.1
    betas: tuple[float, float] = (0.9, 0.95)
    grad_clip: float = 1.0
    optimizer: str = "adamw"
    seed: int = 0
    corpus: list[str] | None = None  # files / folders / "paul-graham" (default)
    tokenizer: str | None = None  # HF folder or name, "bpe:<N>" (trained on the corpus); None = SmolLM2's
    passkey_rate: float = 0.0
    niah_rate: float = 0.0  # fraction of blocks that are single-needle RULER documents (noise haystack)
    passkey_haystack: str = "noise"  # passkey filler: noise (the evaluation's) | corpus (training sentences) | mixed
    niah_haystack: str = "noise"  # filler of the single-needle RULER documents, the same choices
    checkpoint_every: int = 200
    probe_every: int = 0  # every N steps log passkey retrieval at the training length (0 = never)
    probe_n: int = 8  # documents per probe task
    probe_tasks: str = "passkey"  # what the probe scores: passkey, niah or both ("passkey,niah"); the target needs all
    probe_target: float = 0.0  # stop once the probe's exact match >= this for probe_patience probes in a row (0 = off)
    probe_patience: int = 3  # consecutive probes at probe_target that end training (steps is then the cap)
    log_every: int = 10
    resume: bool = False
    precision: str = "auto"  # auto = bf16 autocast on CUDA with bf16 support, else fp32
    device: str = "auto"
    stop_after: int | None = None  # end this invocation after that global step (checkpointed); for preemption tests
    # end the run at this step and keep that model as the final one, the schedule still spanning ``steps``: a run
    # truncated on purpose (e.g. two data mixes compared at equal tokens); a resume with a later one continues it
    final_step: int | None = None
    progress: bool = True

    def validate(self) -> None:
        from posbias.positional import get_scheme

        get_scheme(self.pe)
        if self.probe_every < 0 or self.probe_n < 1:
            raise ValueError("probe_every must be >= 0 and probe_n >= 1")
        if not 0.0 <= self.probe_target <= 1.0 or self.probe_patience < 1:
            raise ValueError("probe_target must be in [0, 1] and probe_patience >= 1")
        if self.probe_target > 0 and self.probe_every <= 0:
            raise ValueError("probe_target needs probe_every > 0 (the probe it waits for)")
        tasks = self.probe_task_names
        if not tasks or any(t not in PROBE_TASKS for t in tasks):
            raise ValueError(f"probe_tasks must name some of {', '.join(PROBE_TASKS)}, got {self.probe_tasks!r}")
        for name in ("steps", "context", "batch_size", "grad_accum", "checkpoint_every", "log_every"):
            if int(getattr(self, name)) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.lr <= 0 or (self.prior_lr is not None and self.prior_lr < 0):
            raise ValueError("learning rates must be positive")
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"unknown optimizer {self.optimizer!r}; known: {', '.join(OPTIMIZERS)}")
        if self.precision not in PRECISIONS:
            raise ValueError(f"unknown precision {self.precision!r}; known: {', '.join(PRECISIONS)}")
        if not 0.0 <= self.passkey_rate <= 1.0:
            raise ValueError(f"passkey_rate must be in [0, 1], got {self.passkey_rate}")
        if not 0.0 <= self.niah_rate <= 1.0 - self.passkey_rate:
            raise ValueError(f"niah_rate must be in [0, 1 - passkey_rate], got {self.niah_rate}")
        check_passkey_haystack(self.passkey_haystack)
        check_passkey_haystack(self.niah_haystack, "niah_haystack")
        if self.final_step is not None and not 1 <= int(self.final_step) <= int(self.steps):
            raise ValueError(f"final_step must lie in [1, steps = {self.steps}], got {self.final_step}")
        if self.warmup_steps < 0 or not 0.0 <= self.min_lr_ratio <= 1.0:
            raise ValueError("warmup_steps must be >= 0 and min_lr_ratio in [0, 1]")
        if self.schedule not in SCHEDULES:
            raise ValueError(f"unknown schedule {self.schedule!r}; known: {', '.join(SCHEDULES)}")
        if not 0.0 < self.decay_fraction <= 1.0:
            raise ValueError(f"decay_fraction must be in (0, 1], got {self.decay_fraction}")
        check_model_overrides(self.model_overrides)

    @property
    def probe_task_names(self) -> tuple[str, ...]:
        return tuple(t.strip() for t in str(self.probe_tasks).split(",") if t.strip())

    def to_json(self) -> dict:
        d = dataclasses.asdict(self)
        d["betas"] = list(self.betas)
        return d


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


def _run_label(cfg: TrainConfig) -> str:
    """What the progress bar calls the run: ``ggd``, ``ggd+ssmax``, ``ggd+ssmax-content``."""
    if not cfg.ssmax:
        return cfg.pe
    return f"{cfg.pe}+ssmax" + ("-content" if cfg.model_overrides.get("ssmax_scope") == "content" else "")


def check_model_overrides(overrides: dict) -> None:
    """Every key must be a :class:`posbias.bam.BamConfig` argument (a Hugging Face config would keep a
    misspelt one as an unused attribute, and the run would train the default silently)."""
    from posbias.bam import BamConfig
    from posbias.utils.options import refuse_unknown

    refuse_unknown(overrides, BamConfig.defaults(), "model option")


def build_bam_config(cfg: TrainConfig, tokenizer):
    from posbias.bam import BamConfig

    n_tok = len(tokenizer)
    overrides = dict(cfg.model_overrides)
    vocab = overrides.pop("vocab_size", 64 * ((n_tok + 63) // 64))
    if vocab < n_tok:
        raise ValueError(f"the tokenizer has {n_tok} tokens but the model vocabulary is {vocab}: "
                         f"use a larger vocab_size or another tokenizer")
    return BamConfig.from_preset(
        cfg.preset, pe=cfg.pe, normaliser="ssmax" if cfg.ssmax else "softmax", vocab_size=vocab,
        max_position_embeddings=cfg.context, pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, **overrides)


def _rng_state() -> dict:
    st = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        st["cuda"] = torch.cuda.get_rng_state_all()
    return st


def _set_rng_state(st: dict) -> None:
    random.setstate(st["python"])
    np.random.set_state(st["numpy"])
    torch.set_rng_state(st["torch"])
    if "cuda" in st and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(st["cuda"])


def _save_checkpoint(path: Path, *, model, optimizer, scheduler, step: int, cfg: TrainConfig, model_config: dict):
    buf = io.BytesIO()
    torch.save({"step": step, "model": model.state_dict(), "optimizer": optimizer.state_dict(),
                "scheduler": scheduler.state_dict(), "rng": _rng_state(), "train_config": cfg.to_json(),
                "model_config": model_config}, buf)
    atomic_write_bytes(path, buf.getvalue())


def _load_checkpoint(path: Path, *, model_config: dict) -> dict:
    try:
        ck = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as e:  # noqa: BLE001
        raise ValueError(f"cannot read checkpoint {path}: {e}") from None
    old = ck.get("model_config", {})
    diff = sorted(k for k in set(old) | set(model_config)
                  if k not in ("transformers_version", "architectures", "dtype", "torch_dtype")
                  and old.get(k) != model_config.get(k))
    if diff:
        details = ", ".join(f"{k}: {old.get(k)!r} -> {model_config.get(k)!r}" for k in diff[:6])
        raise ValueError(f"checkpoint {path} was written for another model config ({details})")
    return ck


def _autocast(cfg: TrainConfig, device: torch.device):
    if cfg.precision == "fp32":
        return nullcontext()
    if cfg.precision == "bf16":
        return torch.autocast(device.type, dtype=torch.bfloat16)
    if device.type == "cuda" and torch.cuda.is_bf16_supported():
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return nullcontext()


def _prior_summary(model) -> dict:
    out = {}
    priors = getattr(model.model, "priors", None)
    if priors is not None and model.config.pe == "ggd":
        a = torch.stack([p.theta_alpha.detach().float() for p in priors])
        b = torch.stack([p.theta_beta.detach().float() for p in priors])
        out.update(theta_alpha_mean=a.mean().item(), theta_beta_mean=b.mean().item(),
                   theta_beta_min=b.min().item(), theta_beta_max=b.max().item())
    if model.config.normaliser == "ssmax":
        s = torch.stack([layer.self_attn.ssmax.s.detach().float() for layer in model.model.layers])
        out["ssmax_s_mean"] = s.mean().item()
    return out


def resume_check_keys(out: Path) -> tuple[str, ...]:
    """The settings a run into ``out`` must share with the run already there: all of
    :data:`RESUME_KEYS` once it holds a checkpoint, the inputs of a tokenizer trained there
    (``bpe:<N>``) once it holds one, none before (nothing is trained yet, settings may be corrected)."""
    if (out / CHECKPOINT).exists():
        return RESUME_KEYS
    if (out / "tokenizer").exists():
        return ("tokenizer", "corpus")
    return ()


def train(config: TrainConfig | dict, *, tokenizer=None,
          callback: Callable[[int, Any, DistInfo], None] | None = None) -> Path:
    """Train a BAM decoder; return the folder of the final model (``out/final``).

    Args:
        config: a :class:`TrainConfig` (or a dict of its fields).
        tokenizer: a tokenizer object (default: ``load_tokenizer(config.tokenizer)``).
        callback: ``callback(step, model, dist_info)`` after every optimizer step (unwrapped model).

    When ``config.stop_after`` ends the run early, the run folder is returned instead (resume
    with ``resume=True``); ``config.final_step`` ends it with a final model (logged as
    ``stopped_by: final_step``). Under torchrun every process calls ``train``; rank 0 writes the files.
    """
    cfg = TrainConfig(**config) if isinstance(config, dict) else config
    cfg.validate()
    info = init_distributed(cfg.device)
    try:
        return _train(cfg, info, tokenizer, callback)
    finally:
        cleanup(info)


def _train(cfg: TrainConfig, info: DistInfo, tokenizer, callback) -> Path:
    """Setup, resume, the step loop (log, probe, checkpoint), the final model."""
    from tqdm.auto import tqdm

    out, tokenizer, ds, probes, bam_cfg = _setup(cfg, info, tokenizer)
    model, optimizer, scheduler = _build(cfg, info, bam_cfg)
    start = _resume(cfg, info, out, model, optimizer, scheduler, bam_cfg.to_dict())
    ddp = _wrap_ddp(model, info)
    last = cfg.final_step or cfg.steps  # the step whose model is the final one
    end = last if cfg.stop_after is None else min(last, cfg.stop_after)
    log = _StepLog(cfg, info, out)
    streak = probe_streak(read_jsonl(out / "metrics.jsonl"), cfg.probe_target, cfg.probe_task_names) \
        if cfg.probe_target else 0
    # a run that already stopped at its target stays stopped (main reads the log; every rank agrees)
    reached = bool(cfg.probe_target) and mean_across(float(streak >= cfg.probe_patience), info) > 0
    bar = tqdm(total=cfg.steps, initial=start, desc=f"train {_run_label(cfg)}",
               disable=not (cfg.progress and info.is_main), dynamic_ncols=True)
    for step in range(start, end):
        if reached:
            break
        loss, gnorm = _step(cfg, info, ddp, model, ds, step, optimizer, scheduler)
        done = step + 1
        if callback is not None:
            callback(done, model, info)
        log.add(loss)
        if done % cfg.log_every == 0 or done == end:
            rec = log.write(done, optimizer, gnorm, model)
            bar.set_postfix(loss=f"{rec['loss']:.3f}", tok_s=f"{rec['tokens_per_s']:,.0f}")
        if cfg.probe_every and (done % cfg.probe_every == 0 or done == end):
            if probes:
                probe = run_probes(model, probes)
                append_jsonl(out / "metrics.jsonl", {"step": done, **probe})
                streak = streak + 1 if cfg.probe_target and _probe_reached(probe, cfg.probe_target, cfg.probe_task_names) else 0
            reached = bool(cfg.probe_target) and mean_across(float(streak >= cfg.probe_patience), info) > 0
            if reached and info.is_main:
                append_jsonl(out / "metrics.jsonl", {"step": done, "stopped_by": "probe_target",
                                                     "probe_target": cfg.probe_target, "tokens": done * log.tokens_per_step})
        bar.update(1)
        if done % cfg.checkpoint_every == 0 or done == end or reached:
            if info.is_main:
                _save_checkpoint(out / CHECKPOINT, model=model, optimizer=optimizer, scheduler=scheduler,
                                 step=done, cfg=cfg, model_config=bam_cfg.to_dict())
            barrier(info)
    bar.close()
    if not reached and start < end == last < cfg.steps and info.is_main:
        append_jsonl(out / "metrics.jsonl", {"step": end, "stopped_by": "final_step", "tokens": end * log.tokens_per_step})
    return _save_final(out, model, tokenizer, info) if reached or end >= last else out


def _probe_reached(probe: dict, target: float, tasks: tuple[str, ...]) -> bool:
    """Every one of ``tasks`` has its exact match (``<task>_em`` in ``probe``) >= ``target``."""
    return all((probe.get(f"{t}_em") or 0) >= target for t in tasks)


def probe_streak(records: list[dict], target: float, tasks: tuple[str, ...] = ("passkey",)) -> int:
    """How many of the last probes in ``records`` (``metrics.jsonl``) reached ``target`` on every one
    of ``tasks`` in a row."""
    streak = 0
    for r in records:
        if r.get(f"{tasks[0]}_em") is not None:
            streak = streak + 1 if _probe_reached(r, target, tasks) else 0
    return streak


def _setup(cfg: TrainConfig, info: DistInfo, tokenizer):
    """The run folder, corpus, tokenizer (``bpe:<N>`` trained here once), packed data and probe."""
    out = Path(cfg.out)
    if (out / CHECKPOINT).exists() and not cfg.resume:
        raise ValueError(f"{out} already holds a checkpoint: pass --resume to continue it, or use another --out")
    if info.is_main:  # before the first file (a bpe:<N> tokenizer) is written into out
        prepare_run_dir(out, cfg.to_json(), kind="train", check_keys=resume_check_keys(out))
    barrier(info)
    texts = load_texts(cfg.corpus)
    if tokenizer is None:
        # "bpe:<N>": a byte-level BPE trained on this corpus, kept in out/tokenizer (reused on resume);
        # the main process trains it, the others read it
        if info.is_main:
            resolve_tokenizer_spec(cfg.tokenizer, texts, out / "tokenizer")
        barrier(info)
        tokenizer = load_tokenizer(resolve_tokenizer_spec(cfg.tokenizer, texts, out / "tokenizer"))
    bam_cfg = build_bam_config(cfg, tokenizer)
    ds = PackedDataset(texts, tokenizer, cfg.context, seed=cfg.seed, passkey_rate=cfg.passkey_rate,
                       niah_rate=cfg.niah_rate, passkey_haystack=cfg.passkey_haystack,
                       niah_haystack=cfg.niah_haystack)
    probes = probe_docs(ds, cfg.probe_n, cfg.probe_task_names) if cfg.probe_every > 0 and info.is_main else None
    if ds.max_token_id >= bam_cfg.vocab_size:
        raise ValueError(f"token id {ds.max_token_id} does not fit the model vocabulary ({bam_cfg.vocab_size})")
    return out, tokenizer, ds, probes, bam_cfg


def _build(cfg: TrainConfig, info: DistInfo, bam_cfg):
    """Seeded model, optimizer and the learning-rate scheduler of ``cfg.schedule``."""
    from posbias.bam import BamForCausalLM

    random.seed(cfg.seed)
    np.random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    model = BamForCausalLM(bam_cfg).to(info.device)
    model.train()
    optimizer = make_optimizer(model, cfg)
    lam = lambda s: lr_lambda(s, steps=cfg.steps, warmup=cfg.warmup_steps, min_ratio=cfg.min_lr_ratio,  # noqa: E731
                              schedule=cfg.schedule, decay_fraction=cfg.decay_fraction)
    return model, optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, lam)


def _resume(cfg: TrainConfig, info: DistInfo, out: Path, model, optimizer, scheduler, model_config: dict) -> int:
    """Load the checkpoint (if resuming) and cut ``metrics.jsonl`` back to it; returns the start step."""
    ck_path = out / CHECKPOINT
    if cfg.resume and ck_path.exists():
        ck = _load_checkpoint(ck_path, model_config=model_config)
        model.load_state_dict(ck["model"])
        optimizer.load_state_dict(ck["optimizer"])
        scheduler.load_state_dict(ck["scheduler"])
        _set_rng_state(ck["rng"])
        start = int(ck["step"])
        if info.is_main:  # drop metrics logged after the checkpoint (they will be redone)
            kept = [r for r in read_jsonl(out / "metrics.jsonl") if r.get("step", 0) <= start]
            atomic_write_text(out / "metrics.jsonl", "".join(json.dumps(r) + "\n" for r in kept))
        return start
    if cfg.resume and info.is_main:
        warnings.warn(f"--resume: no checkpoint in {out}, starting from step 0")
    return 0


def _wrap_ddp(model, info: DistInfo):
    if not info.distributed:
        return model
    from torch.nn.parallel import DistributedDataParallel

    return DistributedDataParallel(model, device_ids=[info.device.index] if info.device.type == "cuda" else None)


def _step(cfg: TrainConfig, info: DistInfo, ddp, model, ds, step: int, optimizer, scheduler) -> tuple[float, float]:
    """One optimizer step over ``grad_accum`` micro-batches (block indices a pure function of the step,
    rank and micro-batch); returns (mean loss, grad norm)."""
    loss_acc = 0.0
    for micro in range(cfg.grad_accum):
        first = ((step * cfg.grad_accum + micro) * info.world_size + info.rank) * cfg.batch_size
        batch = ds.batch(range(first, first + cfg.batch_size))
        batch = {k: v.to(info.device) for k, v in batch.items()}
        sync = micro == cfg.grad_accum - 1 or not info.distributed
        ctx = nullcontext() if sync else ddp.no_sync()
        with ctx, _autocast(cfg, info.device):
            loss = ddp(input_ids=batch["input_ids"], doc_ids=batch["doc_ids"], labels=batch["input_ids"],
                       use_cache=False).loss
            (loss / cfg.grad_accum).backward()
        loss_acc += loss.item() / cfg.grad_accum
    gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    return loss_acc, float(gnorm)


class _StepLog:
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
               "elapsed_s": now - self.t_start, **_prior_summary(model)}
        if self.info.is_main:
            append_jsonl(self.out / "metrics.jsonl", rec)
        self.t_last, self.tokens, self.loss_sum, self.n = now, 0, 0.0, 0
        return rec


def _save_final(out: Path, model, tokenizer, info: DistInfo) -> Path:
    final = out / "final"
    if info.is_main:
        model.save_pretrained(final)
        tokenizer.save_pretrained(final)
    barrier(info)
    return final
