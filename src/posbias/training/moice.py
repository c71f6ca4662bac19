"""Training MoICE routers the reference way: only the routers learn, on general text, with a budget.

The reference run (MoICE, Lin et al. 2024, ``training/train-balance.py``; see
``docs/methods/baselines-reference.md``) trains the routers of a frozen model on ~900 sequences of general
chat data of up to 4,608 tokens, one sequence per step, AdamW at lr 1e-4, with the LM loss plus
0.3 x the Switch load-balancing loss. That is a GPU budget. Here the budget is the user's:

* ``steps`` sequences (one per optimizer step) of ``seq_len`` tokens, cut from a general-text
  corpus that is not an evaluation task (default: the Paul Graham essays; any corpus
  :func:`posbias.utils.corpus.load_texts` reads), and optionally ``max_minutes`` of wall time;
* the sequence of step ``k`` is a pure function of ``(corpus, tokenizer, seq_len, seed, k)``, and a
  checkpoint (routers, optimizer, step, elapsed time) is written atomically every
  ``checkpoint_every`` steps, so a killed run resumes exactly;
* the routers file records the budget that was actually spent (steps, tokens, wall time, why
  training stopped), so a comparison can say what MoICE was given.
"""
from __future__ import annotations

import io
import json
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import torch

from posbias.architecture.layers import model_device
from posbias.utils.io import append_jsonl, atomic_write_bytes, atomic_write_text, read_jsonl
from posbias.utils.progress import progress_bar

CHECKPOINT = "checkpoint.pt"
METRICS = "metrics.jsonl"
REFERENCE_BUDGET = {"sequences": 900, "max_tokens": 4608, "lr": 1e-4, "aux_coef": 0.3,
                    "data": "general chat data (the reference's training/train-balance.py)"}


@dataclass(frozen=True)
class RouterBudget:
    """What router training may spend. Defaults: about 30 minutes for SmolLM2-135M on a 2-core CPU
    (measured: 11.7 s per 512-token step on 1 thread beside another job, README "Baselines"); the
    reference's is :data:`REFERENCE_BUDGET`."""

    steps: int = 150
    seq_len: int = 512
    lr: float = 1e-4
    aux_coef: float = 0.3
    seed: int = 0
    max_minutes: float | None = None
    checkpoint_every: int = 10

    def __post_init__(self):
        if self.steps < 1 or self.seq_len < 2 or self.checkpoint_every < 1:
            raise ValueError(f"moice training: steps >= 1, seq_len >= 2 and checkpoint_every >= 1 needed, got {self}")
        if not self.lr > 0:
            raise ValueError(f"moice training: lr must be > 0, got {self.lr}")
        if self.max_minutes is not None and not self.max_minutes > 0:
            raise ValueError(f"moice training: max_minutes must be > 0, got {self.max_minutes}")


def training_windows(tokenizer, texts: Sequence[str], seq_len: int, count: int, seed: int = 0) -> list[torch.Tensor]:
    """``count`` windows of ``seq_len`` token ids (each a (seq_len,) LongTensor).

    The documents are shuffled with ``seed`` (reshuffled with ``seed + epoch`` when the corpus has
    to be cycled), each followed by EOS, concatenated and cut into consecutive windows. Only as many
    documents as needed are tokenised.
    """
    if not texts:
        raise ValueError("moice training: the corpus has no documents")
    eos = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
    need = seq_len * count
    stream: list[int] = []
    epoch = 0
    while len(stream) < need:
        order = np.random.default_rng(seed + epoch).permutation(len(texts))
        before = len(stream)
        for i in order:
            stream.extend(tokenizer(texts[int(i)], add_special_tokens=False)["input_ids"] + eos)
            if len(stream) >= need:
                break
        if len(stream) == before:
            raise ValueError("moice training: the corpus tokenises to nothing")
        epoch += 1
    ids = torch.tensor(stream[:need], dtype=torch.long)
    return list(ids.view(count, seq_len))


def router_step(handle, ids: torch.Tensor, opt: torch.optim.Optimizer, aux_coef: float) -> dict:
    """One optimizer step on one sequence ``ids`` (T,): LM loss + ``aux_coef`` x load balancing."""
    state = handle.state["moice"]
    model = handle.base_model
    dev = model_device(model)
    ids = ids[None].to(dev)
    out = model(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=False)
    logits = out.logits[:, :-1].float()
    lm = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))
    aux = state.aux_loss().to(lm.device)
    loss = lm + aux_coef * aux
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    return {"loss": float(loss.detach()), "lm": float(lm.detach()), "aux": float(aux.detach())}


class _Frozen:
    """Freeze the model (routers excepted), switch MoICE's load-balancing statistics on; restore after."""

    def __init__(self, handle):
        self.handle = handle

    def __enter__(self):
        model = self.handle.base_model
        self.flags = [(p, p.requires_grad) for p in model.parameters()]
        for p, _ in self.flags:
            p.requires_grad_(False)
        self.handle.state["routers"].train()
        self.handle.state["moice"].collect_aux = True
        return self

    def __exit__(self, *exc):
        state = self.handle.state["moice"]
        state.collect_aux, state.aux = False, []
        self.handle.state["routers"].eval()
        for p, flag in self.flags:
            p.requires_grad_(flag)


def train_routers(handle, windows: Sequence[torch.Tensor], budget: RouterBudget, *, out: str | Path | None = None,
                  progress: bool = True, log: Callable[[dict], None] | None = None) -> dict:
    """Train the routers of an applied MoICE ``handle`` on ``windows`` (one per step, cycled).

    With ``out`` a checkpoint and ``metrics.jsonl`` are kept there and a rerun resumes from the last
    checkpoint (later log lines are dropped first, so the log equals an uninterrupted run's).
    Returns the budget actually spent: ``{"steps_done", "tokens", "seconds", "stopped_by", ...}``.
    """

    routers = handle.state["routers"]
    if not windows:
        raise ValueError("moice training: no training sequences")
    torch.manual_seed(budget.seed)
    opt = torch.optim.AdamW(routers.parameters(), lr=budget.lr, weight_decay=0.0)
    out = Path(out) if out is not None else None
    step, elapsed = _resume(out, routers, opt) if out is not None else (0, 0.0)
    stopped_by = "steps"
    bar = progress_bar(budget.steps, initial=step, desc="moice routers", unit="step", enabled=progress)
    start = time.perf_counter() - elapsed
    with _Frozen(handle):
        while step < budget.steps:
            if budget.max_minutes is not None and time.perf_counter() - start >= 60 * budget.max_minutes:
                stopped_by = "time"
                break
            rec = {"step": step + 1, **router_step(handle, windows[step % len(windows)], opt, budget.aux_coef)}
            if not math.isfinite(rec["loss"]):
                raise RuntimeError(f"moice training diverged at step {step + 1}: {rec}")
            step += 1
            rec["seconds"] = round(time.perf_counter() - start, 2)
            if out is not None:
                append_jsonl(out / METRICS, rec)
                if step % budget.checkpoint_every == 0 or step == budget.steps:
                    _save_checkpoint(out, routers, opt, step, rec["seconds"])
            if log is not None:
                log(rec)
            bar.set_postfix(loss=f"{rec['loss']:.3f}", lm=f"{rec['lm']:.3f}")
            bar.update(1)
    bar.close()
    seconds = time.perf_counter() - start
    if out is not None and stopped_by == "time":
        _save_checkpoint(out, routers, opt, step, seconds)
    return {**asdict(budget), "steps_done": step, "tokens": step * len(windows[0]), "seconds": round(seconds, 1),
            "stopped_by": stopped_by, "reference": REFERENCE_BUDGET}


def _save_checkpoint(out: Path, routers, opt, step: int, seconds: float) -> None:

    buf = io.BytesIO()
    torch.save({"routers": routers.state_dict(), "optimizer": opt.state_dict(), "step": step, "seconds": seconds}, buf)
    atomic_write_bytes(out / CHECKPOINT, buf.getvalue())


def _resume(out: Path, routers, opt) -> tuple[int, float]:
    """Load the checkpoint in ``out`` (if any) and cut ``metrics.jsonl`` back to its step."""
    ckpt_path = out / CHECKPOINT
    step, seconds = 0, 0.0
    if ckpt_path.exists():
        try:
            ckpt = torch.load(ckpt_path, map_location="cpu", weights_only=True)
            routers.load_state_dict(ckpt["routers"])
            opt.load_state_dict(ckpt["optimizer"])
        except Exception as e:  # a foreign or damaged file: say which, never train over it silently
            raise ValueError(f"moice training: cannot resume from {ckpt_path} ({type(e).__name__}: {e}); "
                             "delete it to start over") from None
        step, seconds = int(ckpt["step"]), float(ckpt["seconds"])
    kept = [r for r in read_jsonl(out / METRICS) if r.get("step", 0) <= step]
    if (out / METRICS).exists():
        atomic_write_text(out / METRICS, "".join(_json_line(r) for r in kept))
    return step, seconds


def _json_line(rec: dict) -> str:

    return json.dumps(rec) + "\n"
