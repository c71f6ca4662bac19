"""Held-out check of a search result: accuracy by depth before (no scaling) and after (LPES),
on the *eval* split, which the search never sees."""
from __future__ import annotations

from pathlib import Path

from posbias.evaluation.compare import CompareConfig, compare_methods
from posbias.search.config import SearchConfig

HELDOUT_DEPTHS = (0.0, 0.25, 0.5, 0.75, 1.0)
HELDOUT_BATCH_SIZE = 4


def heldout_config(search: SearchConfig, factors_path: str | Path, out: str | Path,
                   n: int | None = None) -> CompareConfig:
    """The comparison of ``none`` and ``lpes`` (the factors file; ``temperature`` and its values file
    for a temperature search, ``search.target == "temperature"``; a joint search's file holds both and
    goes to ``lpes``) on the held-out split: the search's
    model, task, task options, seed and chat setting, ``n`` instances per depth (default
    ``search.heldout_n``) at :data:`HELDOUT_DEPTHS`."""
    method, option = ("temperature", "values_file") if search.target == "temperature" else ("lpes", "factors")
    return CompareConfig(model=search.model, task=search.task, methods=["none", method], depths=list(HELDOUT_DEPTHS),
                         n=search.heldout_n if n is None else n, out=out,
                         method_options={method: {option: str(factors_path)}}, seed=search.seed,
                         batch_size=HELDOUT_BATCH_SIZE, chat=search.chat, task_options=search.task_options)


def before_after(search: SearchConfig, factors_path: str | Path, out: str | Path, *, n: int | None = None,
                 loaded=None, load=None) -> dict:
    """Evaluate ``none`` and the search's result (:func:`heldout_config`) on the held-out split into ``out``.

    Writes ``out/comparison.md`` and ``out/comparison.png`` (accuracy by depth with 95% Wilson bands, and
    the paired difference to ``none``);
    returns ``{"none": summary, method: summary}``. ``load``: the model's :class:`LoadOptions`.
    """
    return compare_methods(heldout_config(search, factors_path, out, n), loaded=loaded, load=load)
