"""One evaluation run end to end: load model, build instances, apply a method, evaluate."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from posbias.evaluation.runner import evaluate
from posbias.utils.io import prepare_run_dir

# Settings that must match when a run folder is reused (otherwise results would be mixed).
RESUME_KEYS = ("model", "task", "seed", "split", "mode", "chat", "method", "method_options", "task_options")


def build_instances(tokenizer, task: str, depths: list[float], n: int, seed: int, split: str,
                    task_options: dict[str, Any]):
    from posbias.tasks import make_instances

    return make_instances(task, tokenizer=tokenizer, n=n, depths=depths, seed=seed, split=split, **task_options)


def run_eval(*, model: str, task: str, depths: list[float], n: int, out: str | Path, seed: int = 0,
             split: str = "eval", mode: str = "teacher-forced", batch_size: int = 8, chat: bool = False,
             max_new_tokens: int = 16, method: str = "none", method_options: dict | None = None,
             task_options: dict | None = None, loaded=None) -> dict:
    """Evaluate ``model`` (spec, or ``loaded=(model, tokenizer)``) with ``method`` on ``task``.

    Instances are built (and validated) before anything is written, so bad input never leaves
    a half-made run folder behind.
    """
    method_options = dict(method_options or {})
    task_options = dict(task_options or {})
    if loaded is None:
        from posbias.models import load_model

        loaded = load_model(model)
    lm, tok = loaded
    instances = build_instances(tok, task, depths, n, seed, split, task_options)
    config = {"model": model, "task": task, "depths": depths, "n": n, "seed": seed, "split": split, "mode": mode,
              "batch_size": batch_size, "chat": chat, "max_new_tokens": max_new_tokens, "method": method,
              "method_options": method_options, "task_options": task_options}
    out = prepare_run_dir(out, config, check_keys=RESUME_KEYS)
    with _method(lm, method, method_options) as scored_model:
        return evaluate(scored_model, tok, instances, out, mode=mode, batch_size=batch_size, chat=chat,
                        max_new_tokens=max_new_tokens, label=f"{method} / {task}")


class _method:
    """Context manager applying a registered inference method (``none`` needs no registry)."""

    def __init__(self, model, name: str, options: dict):
        self.model, self.name, self.options, self.handle = model, name, options, None

    def __enter__(self):
        if self.name == "none" and not self.options:
            return self.model
        from posbias.methods import apply_method

        self.handle = apply_method(self.model, self.name, **self.options)
        return getattr(self.handle, "model", self.model)

    def __exit__(self, *exc):
        if self.handle is not None:
            self.handle.remove()
