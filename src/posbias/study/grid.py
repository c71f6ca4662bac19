"""The evaluation grid of the extrapolation study, for one trained model.

* scheme names: ``"<pe>[+ssmax]"`` with ``pe`` in rope | sinusoidal | nope | alibi | ggd | kerple-log |
  kerple-power | fire
  (``+ssmax-content``: SSMax scaling the content logits only, the prior added after: an ablation)
  (:func:`parse_scheme`);
* lengths: multiples of the training context (:func:`grid_lengths`);
* :func:`evaluate_model`: passkey (teacher-forced + generation) over lengths x depths, NIAH
  optionally, and perplexity in both modes at a few multiples, each appended to its own jsonl
  under the study folder and skipped on a rerun when already there.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterable, Sequence

import torch

from posbias.evaluation import long_context
from posbias.evaluation.long_context import GridSpec, check_lengths
from posbias.evaluation.perplexity import perplexity
from posbias.utils.corpus import load_texts
from posbias.utils.io import append_jsonl, read_jsonl

if TYPE_CHECKING:  # posbias.study.config imports this module
    from posbias.study.config import StudyConfig

PES = ("rope", "sinusoidal", "nope", "alibi", "ggd", "kerple-log", "kerple-power", "fire")
NORMALISERS = ("softmax", "ssmax", "ssmax-content")  # ssmax-content: SSMax on the content logits only
DEFAULT_SCHEMES = ("rope", "sinusoidal", "nope", "alibi", "ggd", "ggd+ssmax", "rope+ssmax")
DEFAULT_MULTIPLIERS = (1, 2, 4, 8, 16, 32, 64)
DEFAULT_DEPTHS = (0.0, 0.25, 0.5, 0.75, 1.0)
DEFAULT_PPL_MULTIPLIERS = (1, 2, 4, 8)

PASSKEY_FILE = "passkey.jsonl"
NIAH_FILE = "niah.jsonl"
PASSKEY_ESSAY_FILE = "passkey-essay.jsonl"
NIAH_ESSAY_FILE = "niah-essay.jsonl"
PASSKEY_HELDOUT_FILE = "passkey-heldout.jsonl"
# (view name, task, file) of every grid a study can run; the options come from grid_views
VIEW_FILES = (("passkey", "passkey", PASSKEY_FILE), ("passkey-essay", "passkey", PASSKEY_ESSAY_FILE),
              ("passkey-heldout", "passkey", PASSKEY_HELDOUT_FILE),
              ("niah", "niah", NIAH_FILE), ("niah-essay", "niah", NIAH_ESSAY_FILE))


def grid_views(*, niah: bool = False, niah_options: dict | None = None, passkey_essay: bool = False,
               niah_essay: bool = False, passkey_heldout: str | None = None) -> list[tuple[str, str, dict, str]]:
    """``(view, task, task options, file)`` of the grids to run: passkey in its grass/sky filler, the
    same passkey in the essay haystack (``passkey_essay``: the first essay sentences, a filler the
    noise-trained models never saw, but text that may lie in the training corpus), the same passkey in
    the sentences of the held-out text (``passkey_heldout``: its path; text no model trained on), NIAH
    (RULER single_1, noise haystack, the one in the training mix) and NIAH in the essays (``niah_essay``:
    RULER single_2)."""
    views = [("passkey", "passkey", {}, PASSKEY_FILE)]
    if passkey_essay:
        views.append(("passkey-essay", "passkey", {"haystack": "essay"}, PASSKEY_ESSAY_FILE))
    if passkey_heldout:
        views.append(("passkey-heldout", "passkey", {"haystack": str(passkey_heldout)}, PASSKEY_HELDOUT_FILE))
    if niah:
        views.append(("niah", "niah", dict(niah_options or {}), NIAH_FILE))
    if niah_essay:
        views.append(("niah-essay", "niah", {**(niah_options or {}), "haystack": "essay"}, NIAH_ESSAY_FILE))
    return views


PPL_FILE = "perplexity.jsonl"
TRAIN_PPL_FILE = "perplexity-train.jsonl"  # the training text at the training context (memorisation check)


def parse_scheme(name: str) -> tuple[str, str]:
    """``"ggd+ssmax"`` -> ``("ggd", "ssmax")``; ``"rope"`` -> ``("rope", "softmax")``."""
    parts = [p.strip().lower() for p in str(name).split("+") if p.strip()]
    if not parts or parts[0] not in PES or len(parts) > 2 or (len(parts) == 2 and parts[1] not in NORMALISERS):
        raise ValueError(f"bad scheme {name!r}: use <pe>[+ssmax] with pe in {', '.join(PES)} "
                         f"(e.g. rope, ggd+ssmax)")
    return parts[0], (parts[1] if len(parts) == 2 else "softmax")


def scheme_name(pe: str, normaliser: str) -> str:
    return pe if normaliser == "softmax" else f"{pe}+{normaliser}"


def parse_schemes(text: str | Sequence[str]) -> list[str]:
    """Comma-separated scheme names -> canonical names (duplicates dropped, order kept)."""
    items = text.split(",") if isinstance(text, str) else list(text)
    out: list[str] = []
    for item in items:
        if str(item).strip():
            name = scheme_name(*parse_scheme(item))
            if name not in out:
                out.append(name)
    if not out:
        raise ValueError("no schemes given")
    return out


def grid_lengths(train_context: int, multipliers: Iterable[float]) -> list[int]:
    """``[round(m * train_context)]`` for each multiplier, sorted, duplicates dropped."""
    if train_context < 1:
        raise ValueError(f"train_context must be positive, got {train_context}")
    out = sorted({int(round(float(m) * train_context)) for m in multipliers})
    if not out or out[0] < 1:
        raise ValueError(f"multipliers must be positive, got {list(multipliers)}")
    return out


# ----------------------------------------------------------------------------- perplexity data

def eval_tokens_from_corpus(tokenizer, path: str | Path, n_tokens: int) -> list[int]:
    """The **last** ``n_tokens`` tokens of the corpus (documents joined by EOS).

    Held out by position: a study trains on the beginning of the corpus stream, so the tail is
    the part least likely to have been seen (the runner warns when the training run reports that
    it consumed the whole corpus).
    """
    eos = tokenizer.eos_token_id
    docs = load_texts(path)
    out: list[int] = []
    for text in reversed(docs):
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        if eos is not None:
            ids = ids + [eos]
        out = ids + out
        if len(out) >= n_tokens:
            break
    if len(out) < 2:
        raise ValueError(f"corpus {path} gave fewer than 2 tokens")
    return out[-n_tokens:]


# ----------------------------------------------------------------------------- one model

def run_perplexity(model, token_ids, *, model_name: str, out_jsonl: str | Path, contexts: Sequence[int],
                   modes: Sequence[str] = ("non-overlapping", "sliding"), batch_size: int = 1,
                   extra: dict | None = None, progress: bool = False) -> list[dict]:
    """Perplexity at each context and mode; one jsonl line each, skipped when already there."""


    out_jsonl = Path(out_jsonl)
    existing = [r for r in read_jsonl(out_jsonl) if r.get("model") == model_name]
    done = {(int(r["context"]), r["mode"]) for r in existing}
    records = list(existing)
    ids = torch.as_tensor(token_ids, dtype=torch.long)
    check_lengths(model, contexts)
    for ctx in sorted({int(c) for c in contexts}):
        if ctx > ids.numel():
            continue
        for mode in modes:
            if (ctx, mode) in done:
                continue
            r = perplexity(model, ids, context=ctx, mode=mode, batch_size=batch_size, progress=progress)
            rec = {"model": model_name, **(extra or {}), **r, "eval_tokens": int(ids.numel())}
            append_jsonl(out_jsonl, rec)
            records.append(rec)
    return records


def evaluate_model(model, tokenizer, cfg: StudyConfig, *, name: str, passkey_heldout: str | None = None,
                   ppl_tokens: Sequence[int] | None = None, extra: dict | None = None,
                   make_instances: Callable | None = None, progress: bool = True,
                   log: Callable = print) -> dict[str, list[dict]]:
    """Passkey grid (+ the NIAH and other views ``cfg`` asks for) and perplexity of one model into
    ``cfg.out``; returns the records.

    The grid is ``cfg.lengths x cfg.depths`` with :meth:`StudyConfig.n_at` instances per cell (fewer at
    the far lengths); ``passkey_heldout``: the held-out text's path for the passkey-in-held-out-text
    view (when ``cfg.passkey_heldout``); ``ppl_tokens``: the held-out tokens of the perplexity at
    ``cfg.ppl_contexts`` (None: no perplexity). ``cfg.dead_after`` > 0: a view stops for this model once
    that many consecutive lengths (shortest first) had no instance right in any mode; its longer
    lengths are left unscored (a collapsed scheme costs nothing at 64x+). Lengths the model cannot
    reach (``LengthBeyondModelError``) are never silently dropped: a study model is a BAM model, which
    runs at any length. ``cfg.needle_draw``: see :func:`posbias.evaluation.long_context.grid_instances`.
    """
    out = Path(cfg.out)
    res: dict[str, list[dict]] = {}
    common = dict(model_name=name, extra=extra, make_instances=make_instances, progress=progress)
    for view, task, options, fname in grid_views(niah=cfg.niah, niah_options=cfg.niah_options,
                                                 passkey_essay=cfg.passkey_essay, niah_essay=cfg.niah_essay,
                                                 passkey_heldout=passkey_heldout if cfg.passkey_heldout else None):
        spec = GridSpec(lengths=cfg.lengths, depths=cfg.depths, task=task, seed=cfg.seed, modes=cfg.modes,
                        batch_size=cfg.batch_size, token_budget=cfg.token_budget, task_kwargs=options,
                        needle_draw=cfg.needle_draw)
        res[view] = _run_view(model, tokenizer, spec, out_jsonl=out / fname, n_at=cfg.n_at, dead_after=cfg.dead_after,
                              common=common, log=lambda msg, view=view: log(f"[study] {name} {view}: {msg}"))
    if ppl_tokens is not None and len(cfg.ppl_contexts):
        res["perplexity"] = run_perplexity(model, ppl_tokens, model_name=name, out_jsonl=out / PPL_FILE,
                                           contexts=cfg.ppl_contexts, extra=extra, progress=progress)
    return res


def check_grid_fits(cfg: StudyConfig, tokenizer, *, passkey_heldout: str | None = None,
                    make_instances: Callable | None = None) -> None:
    """Build the instances of every view's first cell (the shortest length of ``cfg.lengths``) with
    the tokenizer the models train with: a prompt that cannot fit there is a ``ValueError`` of one
    line now, before any scheme trains, rather than after every one has. Arguments as
    :func:`evaluate_model`'s."""
    length = min(cfg.lengths)
    for view, task, options, _file in grid_views(niah=cfg.niah, niah_options=cfg.niah_options,
                                                 passkey_essay=cfg.passkey_essay, niah_essay=cfg.niah_essay,
                                                 passkey_heldout=passkey_heldout if cfg.passkey_heldout else None):
        try:
            long_context.grid_instances(tokenizer, task=task, length=length, depths=cfg.depths, n=cfg.n_at(length),
                                        seed=cfg.seed, make_instances=make_instances, task_kwargs=options,
                                        needle_draw=cfg.needle_draw)
        except ValueError as e:
            raise ValueError(f"the study's shortest length cannot hold its {view} prompt ({e}); nothing was "
                             "trained: raise --train-context or the smallest --multipliers") from None


def _run_view(model, tokenizer, spec: GridSpec, *, out_jsonl: Path, n_at: Callable[[int], int], dead_after: int,
              common: dict, log: Callable) -> list[dict]:
    """One view's grid, ``n_at(length)`` instances per cell: all lengths of one cell size at once, or
    shortest first until ``dead_after`` dead lengths."""

    ordered = sorted({int(L) for L in spec.lengths})
    if not dead_after:
        records = []
        for n in sorted({n_at(L) for L in ordered}):
            part = dataclasses.replace(spec, n=n, lengths=[L for L in ordered if n_at(L) == n])
            records = long_context.run_grid(model, tokenizer, part, out_jsonl=out_jsonl, **common)
        return records
    name = common["model_name"]
    earlier = [r for r in read_jsonl(out_jsonl) if r.get("model") == name and r.get("task") == spec.task]
    records, dead = earlier, dead_before(earlier, ordered[0])
    if dead >= dead_after:
        log(f"0 right at {dead} lengths in a row below {ordered[0]} (earlier invocations); lengths {ordered} "
            "not scored")
        return records
    for i, length in enumerate(ordered):
        part = dataclasses.replace(spec, n=n_at(length), lengths=[length])
        records = long_context.run_grid(model, tokenizer, part, out_jsonl=out_jsonl, **common)
        dead = dead + 1 if not any(is_right(r) for r in records if int(r["length"]) == length) else 0
        if dead >= dead_after and i + 1 < len(ordered):
            log(f"0 right at {dead} lengths in a row (up to {length}); lengths {ordered[i + 1:]} not scored")
            break
    return records


def dead_before(records: Iterable[dict], length: int) -> int:
    """How many of the lengths shorter than ``length`` in ``records`` (one model's and view's, from earlier
    invocations) had no instance right, counted back from the longest of them (0 when none: the rule of
    ``--dead-after`` carried across invocations, so far lengths asked later skip a scheme dead below them)."""
    right: dict[int, bool] = {}
    for r in records:
        if int(r["length"]) < length:
            right[int(r["length"])] = right.get(int(r["length"]), False) or is_right(r)
    dead = 0
    for L in sorted(right, reverse=True):
        if right[L]:
            break
        dead += 1
    return dead


def is_right(record: dict) -> bool:
    """An instance answered right in any scoring mode (teacher-forced exact match, or a generation score > 0)."""
    return bool(record.get("tf_em")) or (record.get("gen_score") or 0) > 0
