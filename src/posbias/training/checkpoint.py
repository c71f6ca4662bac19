"""The checkpoint of a BAM training run (``<out>/checkpoint.pt``): model, optimizer, scheduler, RNG
states, the step (= the data position) and the metrics log's loss window, written atomically and
read without pickle.

Everything in it is a tensor or a plain value (dict, list, tuple, str, number, bool, None), so it is
read with ``torch.load(..., weights_only=True)``: a checkpoint that holds any other Python object
(written by an older posbias, whose RNG states were numpy arrays, or planted in a folder handed to
someone) is refused with one line and never unpickled, since unpickling can run code.
"""
from __future__ import annotations

import io
import pickle
import random
from pathlib import Path

import numpy as np
import torch

from posbias.utils.io import atomic_write_bytes

from .config import RESUME_KEYS, TrainConfig

CHECKPOINT = "checkpoint.pt"
# model config entries that may differ between a checkpoint and the run resuming it
_UNCHECKED_MODEL_KEYS = ("transformers_version", "architectures", "dtype", "torch_dtype")


def rng_state() -> dict:
    """The Python, numpy, torch (and CUDA) RNG states as tensors and plain values."""
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    st = {"python": random.getstate(),
          "numpy": {"kind": kind, "keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(pos),
                    "has_gauss": int(has_gauss), "gauss": float(gauss)},
          "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        st["cuda"] = torch.cuda.get_rng_state_all()
    return st


def set_rng_state(st: dict) -> None:
    """Restore what :func:`rng_state` recorded."""
    version, internal, gauss_next = st["python"]
    random.setstate((version, tuple(internal), gauss_next))
    n = st["numpy"]
    np.random.set_state((n["kind"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["gauss"]))
    torch.set_rng_state(st["torch"])
    if "cuda" in st and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(st["cuda"])


def save_checkpoint(path: Path, *, model, optimizer, scheduler, step: int, cfg: TrainConfig,
                    model_config: dict, log_window: dict | None = None) -> None:
    """Write the checkpoint of ``step`` atomically (a kill leaves the previous one whole);
    ``log_window``: the metrics log's loss window (:meth:`posbias.training.step_log.StepLog.window`)."""
    buf = io.BytesIO()
    torch.save({"step": step, "model": model.state_dict(), "optimizer": optimizer.state_dict(),
                "scheduler": scheduler.state_dict(), "rng": rng_state(), "train_config": cfg.to_json(),
                "model_config": model_config, "log_window": log_window}, buf)
    atomic_write_bytes(path, buf.getvalue())


def load_checkpoint(path: Path, *, model_config: dict) -> dict:
    """Read ``path`` with ``weights_only=True`` and check it was written for ``model_config``;
    a ``ValueError`` of one line for a checkpoint that needs pickle, cannot be read, or belongs to
    another model."""
    try:
        ck = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        if "Unsupported global" in str(e):
            raise ValueError(f"checkpoint {path} holds Python objects that only pickle can load (an older "
                             "posbias or a foreign file); it is not loaded, since unpickling can run code: "
                             "delete it to train from step 0, or use another --out") from None
        raise ValueError(f"cannot read checkpoint {path}: not a torch checkpoint (truncated or foreign)") from None
    except Exception as e:  # noqa: BLE001 (a truncated or foreign file: zip, EOF, runtime errors)
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ValueError(f"cannot read checkpoint {path}: {first}") from None
    if not isinstance(ck, dict) or not {"step", "model", "optimizer", "scheduler", "rng"} <= set(ck):
        raise ValueError(f"checkpoint {path} is not a posbias training checkpoint; delete it or use another --out")
    old = ck.get("model_config", {})
    diff = sorted(k for k in set(old) | set(model_config)
                  if k not in _UNCHECKED_MODEL_KEYS and old.get(k) != model_config.get(k))
    if diff:
        details = ", ".join(f"{k}: {old.get(k)!r} -> {model_config.get(k)!r}" for k in diff[:6])
        raise ValueError(f"checkpoint {path} was written for another model config ({details})")
    return ck


def resume_check_keys(out: Path) -> tuple[str, ...]:
    """The settings a run into ``out`` must share with the run already there: all of
    :data:`RESUME_KEYS` once it holds a checkpoint, the inputs of a tokenizer trained there
    (``bpe:<N>``) once it holds one, none before (nothing is trained yet, settings may be corrected)."""
    if (out / CHECKPOINT).exists():
        return RESUME_KEYS
    if (out / "tokenizer").exists():
        return ("tokenizer", "corpus")
    return ()
