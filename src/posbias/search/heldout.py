"""Held-out check of a search result: accuracy by depth before (no scaling) and after (LPES),
on the *eval* split, which the search never sees."""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

from posbias.evaluation.compare import compare_methods

HELDOUT_DEPTHS = (0.0, 0.25, 0.5, 0.75, 1.0)


def before_after(*, model: str, task: str, factors_path: str | Path, out: str | Path, n: int = 20,
                 depths: Sequence[float] = HELDOUT_DEPTHS, seed: int = 0, task_options: dict | None = None,
                 chat: bool = False, batch_size: int = 4, loaded=None, load=None, target: str = "rope") -> dict:
    """Evaluate ``none`` and ``lpes`` (the factors file; ``temperature`` for a temperature search's
    values file, ``target="temperature"``) on the held-out split into ``out``.

    Writes ``out/comparison.md`` and ``out/comparison.png`` (accuracy by depth with 95% Wilson bands, and
    the paired difference to ``none``);
    returns ``{"none": summary, method: summary}``. ``load``: the model's :class:`LoadOptions`.
    """
    method, option = ("temperature", "values_file") if target == "temperature" else ("lpes", "factors")
    return compare_methods(model=model, task=task, methods=["none", method], depths=list(depths), n=n, out=out,
                           method_options={method: {option: str(factors_path)}}, seed=seed,
                           batch_size=batch_size, chat=chat, task_options=task_options, loaded=loaded, load=load)
