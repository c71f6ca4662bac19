"""Pre-training loop for BAM decoders: :func:`train` (settings: :class:`TrainConfig` in :mod:`.config`).

The schedule and optimizer (:mod:`.schedule`), gradient clipping, bf16 autocast on CUDA, DDP under
torchrun, atomic checkpoints read without pickle (:mod:`.checkpoint`: model, optimizer, scheduler,
RNG, step = data position), the metrics log (:mod:`.step_log`) and an exact ``resume``: a run killed after a checkpoint
and resumed ends with the same weights as an
uninterrupted one. Writes ``config.json``, ``metrics.jsonl``, ``checkpoint.pt`` and the final
model (``save_pretrained``) under ``out/final``.
"""
from __future__ import annotations

import json
import random
import warnings
from contextlib import nullcontext
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
from torch.nn.parallel import DistributedDataParallel

from posbias.bam import BamForCausalLM
from posbias.positional import project_parameters
from posbias.utils.io import append_jsonl, atomic_write_text, read_jsonl
from posbias.utils.progress import progress_bar
from posbias.utils.run_folder import announce_resume, prepare_run_dir

from .checkpoint import CHECKPOINT, load_checkpoint, resume_check_keys, save_checkpoint, set_rng_state
from .config import OPTIMIZERS, PRECISIONS, RESUME_KEYS, SCHEDULES, TrainConfig, build_bam_config, run_label
from .data import PackedDataset, load_texts, load_tokenizer
from .distributed import DistInfo, barrier, cleanup, init_distributed, mean_across
from .probe import probe_docs, probe_postfix, run_probes
from .schedule import lr_lambda, make_optimizer, make_scheduler, param_groups
from .step_log import StepLog, probe_reached, probe_streak
from .tokenizer import parse_bpe_spec, resolve_tokenizer_spec

# names callers import from here (the loop's parts live in the modules above)
__all__ = ["CHECKPOINT", "OPTIMIZERS", "PRECISIONS", "RESUME_KEYS", "SCHEDULES", "TrainConfig", "build_bam_config",
           "load_checkpoint", "lr_lambda", "make_optimizer", "param_groups", "probe_streak", "resume_check_keys",
           "run_label", "train"]


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

    out, tokenizer, ds, probes, bam_cfg = _setup(cfg, info, tokenizer)
    model, optimizer, scheduler = _build(cfg, info, bam_cfg)
    start, window = _resume(cfg, info, out, model, optimizer, scheduler, bam_cfg.to_dict())
    ddp = _wrap_ddp(model, info)
    last = cfg.final_step or cfg.steps  # the step whose model is the final one
    end = last if cfg.stop_after is None else min(last, cfg.stop_after)
    log = StepLog(cfg, info, out, window)
    streak = probe_streak(read_jsonl(out / "metrics.jsonl"), cfg.probe_target, cfg.probe_task_names) \
        if cfg.probe_target else 0
    # a run that already stopped at its target stays stopped (main reads the log; every rank agrees)
    reached = bool(cfg.probe_target) and mean_across(float(streak >= cfg.probe_patience), info) > 0
    bar = progress_bar(cfg.steps, initial=start, desc=f"train {run_label(cfg)}",
                       enabled=cfg.progress and info.is_main, dynamic_ncols=True)
    postfix: dict[str, str] = {}  # what the bar shows beside the step count: loss, tokens/s, the last probe
    for step in range(start, end):
        if reached:
            break
        loss, gnorm = _step(cfg, info, ddp, model, ds, step, optimizer, scheduler)
        done = step + 1
        if callback is not None:
            callback(done, model, info)
        log.add(loss)
        if done % cfg.log_every == 0 or done == end:
            rec = log.write(done, optimizer, gnorm, model, restart=done % cfg.log_every == 0)
            postfix.update(loss=f"{rec['loss']:.3f}", tok_s=f"{rec['tokens_per_s']:,.0f}")
            bar.set_postfix(postfix)
        if cfg.probe_every and (done % cfg.probe_every == 0 or done == end):
            if probes:
                probe = run_probes(model, probes)
                append_jsonl(out / "metrics.jsonl", {"step": done, **probe})
                postfix.update(probe_postfix(probe))
                bar.set_postfix(postfix)
                streak = streak + 1 if cfg.probe_target and probe_reached(probe, cfg.probe_target,
                                                                          cfg.probe_task_names) else 0
            reached = bool(cfg.probe_target) and mean_across(float(streak >= cfg.probe_patience), info) > 0
            if reached and info.is_main:
                append_jsonl(out / "metrics.jsonl", {"step": done, "stopped_by": "probe_target",
                                                     "probe_target": cfg.probe_target,
                                                     "tokens": done * log.tokens_per_step})
        bar.update(1)
        if done % cfg.checkpoint_every == 0 or done == end or reached:
            window = log.window()  # on every rank (a mean across them)
            if info.is_main:
                save_checkpoint(out / CHECKPOINT, model=model, optimizer=optimizer, scheduler=scheduler,
                                step=done, cfg=cfg, model_config=bam_cfg.to_dict(), log_window=window)
            barrier(info)
    bar.close()
    if not reached and start < end == last < cfg.steps and info.is_main:
        append_jsonl(out / "metrics.jsonl",
                     {"step": end, "stopped_by": "final_step", "tokens": end * log.tokens_per_step})
    return _save_final(out, model, tokenizer, info) if reached or end >= last else out


def _setup(cfg: TrainConfig, info: DistInfo, tokenizer):
    """The run folder, corpus, tokenizer (``bpe:<N>`` trained here once), packed data and probe."""
    out = Path(cfg.out)
    if (out / CHECKPOINT).exists() and not cfg.resume:
        raise ValueError(f"{out} already holds a checkpoint: pass resume=True to continue it, or use another --out")
    texts = load_texts(cfg.corpus)  # a bad corpus is refused before the run folder is written
    if tokenizer is None and parse_bpe_spec(cfg.tokenizer) is None:
        tokenizer = load_tokenizer(cfg.tokenizer)  # and so is a given tokenizer that cannot be read
    if info.is_main:  # before the first file (a bpe:<N> tokenizer) is written into out
        prepare_run_dir(out, cfg.to_json(), kind="train", check_keys=resume_check_keys(out))
    barrier(info)
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

    random.seed(cfg.seed)
    np.random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    model = BamForCausalLM(bam_cfg).to(info.device)
    model.train()
    optimizer = make_optimizer(model, cfg)
    return model, optimizer, make_scheduler(optimizer, cfg)


def _resume(cfg: TrainConfig, info: DistInfo, out: Path, model, optimizer, scheduler,
            model_config: dict) -> tuple[int, dict | None]:
    """Load the checkpoint (if resuming) and cut ``metrics.jsonl`` back to it: the lines a killed run
    logged after its checkpoint are dropped (they will be redone), and a run that starts from step 0
    starts the file anew (the lines of a run killed before its first checkpoint describe nothing kept).
    Returns the start step and the metrics log's loss window at it (None: an empty one)."""
    ck_path = out / CHECKPOINT
    start, window = 0, None
    if cfg.resume and ck_path.exists():
        ck = load_checkpoint(ck_path, model_config=model_config)
        model.load_state_dict(ck["model"])
        optimizer.load_state_dict(ck["optimizer"])
        scheduler.load_state_dict(ck["scheduler"])
        set_rng_state(ck["rng"])
        start, window = int(ck["step"]), ck.get("log_window")
        if info.is_main:
            announce_resume(start, cfg.final_step or cfg.steps, "steps", out)
    elif cfg.resume and info.is_main:
        warnings.warn(f"resume=True: no checkpoint in {out}, starting from step 0", stacklevel=2)
    if info.is_main:
        kept = [r for r in read_jsonl(out / "metrics.jsonl") if r.get("step", 0) <= start] if start else []
        atomic_write_text(out / "metrics.jsonl", "".join(json.dumps(r) + "\n" for r in kept))
    return start, window


def _wrap_ddp(model, info: DistInfo):
    if not info.distributed:
        return model

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
    project_parameters(model)  # constrained priors (KERPLE) back into their domain
    scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    return loss_acc, float(gnorm)


def _autocast(cfg: TrainConfig, device: torch.device):
    if cfg.precision == "fp32":
        return nullcontext()
    if cfg.precision == "bf16":
        return torch.autocast(device.type, dtype=torch.bfloat16)
    if device.type == "cuda" and torch.cuda.is_bf16_supported():
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return nullcontext()


def _save_final(out: Path, model, tokenizer, info: DistInfo) -> Path:
    final = out / "final"
    if info.is_main:
        model.save_pretrained(final)
        tokenizer.save_pretrained(final)
    barrier(info)
    return final
