"""The length-extrapolation study (BAM paper, small scale): train one model per positional scheme
on an identical budget, then evaluate each from 1x to Kx its training length.

What it does, into ``--out``:

1. ``models/<scheme>/`` - one model per scheme, trained by :func:`posbias.training.train` with
   the same preset, data, seed, steps and context (only ``pe`` / ``ssmax`` differ); a finished
   model is never retrained (``models.json`` maps scheme -> model folder) and a training run
   killed midway resumes from its checkpoint. The training text is the corpus minus a held-out
   tail (``data/train.jsonl``, ``data/heldout.jsonl``), with ``--passkey-rate`` (default 0.1) of
   the training blocks being synthetic passkey documents at the training length, so every scheme
   learns the retrieval format within its training context and the grid measures only how that
   skill extrapolates. ``--passkey-rate 0`` trains on plain text only.
2. ``passkey.jsonl`` (``niah.jsonl``) - passkey retrieval over lengths x depths, scored
   teacher-forced (the argmax at every answer-token position must equal the gold token, as in
   the BAM reference: the 5 digits, plus the leading-space token where the tokenizer splits it
   off, as SmolLM2's does) and by greedy generation (metric ``passkey``); one line per (model,
   length, instance), so a killed run resumes.
3. ``perplexity.jsonl`` - perplexity on held-out corpus text at 1x..Kx the training length, both
   non-overlapping and sliding-window (the sliding figure alone hides a model that only looks
   locally); ``perplexity-train.jsonl`` - the same on as many tokens of the training text at the
   training length (a held-out / training ratio far above 1 is memorisation of a small corpus).
4. ``metrics.jsonl`` (one line per cell / curve point, rewritten at the end), ``summary.md``
   (accuracy by length per scheme, perplexity tables, the learned GGD priors) and PNGs in
   ``plots/``: heatmaps per scheme, accuracy against length, perplexity against length, the
   learned GGD priors, attention maps on one passkey instance and, when the trainer probed, the 1x
   probes against the training step (``training_probes.png``).

On a 2-core CPU, SmolLM2's 49K-token vocabulary makes training too slow (~200-340 tokens/s for
the tiny preset), so the CPU study trains a byte-level BPE of 1024 tokens on the training split
(``--tokenizer bpe:1024``; digits stay single tokens) and gets ~6.5-7.5K tokens/s per process with
one thread, two schemes at a time (``--train-workers 2``). With half the blocks being passkey
documents at a raised lr, the tiny models learn to retrieve the key within their training
context after ~2-3K steps (an induction-head phase change; before it, every scheme is at 0%).
The measured CPU study (README; about 1 h of training, 3000 steps x 8 x 256 tokens per scheme)::

    posbias study --preset tiny --out runs/study-cpu-bpe \\
        --schemes ggd+ssmax,ggd,alibi,rope,rope+ssmax,sinusoidal,nope \\
        --tokenizer bpe:1024 --train-steps 3000 --train-context 256 \\
        --train-opt batch_size=8 --train-opt lr=3e-3 --train-opt warmup_steps=50 --passkey-rate 0.5 \\
        --train-workers 2 --multipliers 1,2,4,8,16,32,64 --depths 0,0.5,1 --n 2 \\
        --ppl-multipliers 1,4,16 --seed 0

On a GPU node, the paper-like setting (120M model, 512-token training context, a real corpus
as ``.txt`` / ``.jsonl`` with a ``"text"`` field / a folder of them; the trainer reads it into
memory)::

    posbias study --preset 120m --corpus /data/corpus.jsonl --out runs/study-120m \\
        --train-steps 20000 --train-context 512 --train-opt batch_size=64 \\
        --schemes rope,sinusoidal,nope,alibi,ggd,ggd+ssmax,rope+ssmax \\
        --multipliers 1,2,4,8,16,32,64,128 --depths 0,0.25,0.5,0.75,1 --n 10 --niah

(The paper's budget is 589,824 tokens per step: ``--train-opt batch_size=64 --train-opt
grad_accum=18``.) The 1000x point (512K tokens) costs far more than the rest of the grid; run
it afterwards for the schemes that are still alive at 128x, e.g. ``--schemes ggd+ssmax
--multipliers 256,512,1000`` on the same ``--out`` (same training settings: the
models are reused and the new cells appended).

The scripts under ``experiments/extrapolation-*`` run this command. Rerunning the same command resumes:
trained models are reused and finished grid cells skipped; ``config.json`` refuses a rerun whose
training settings differ.
"""
from __future__ import annotations

import json
import math
import shutil
from pathlib import Path
from typing import Callable, Sequence

from posbias.evaluation.batching import encode
from posbias.evaluation.long_context import grid_instances
from posbias.study.config import (  # noqa: F401
    CHECK_KEYS,
    DATA_DIR,
    METRICS_FILE,
    MODELS_FILE,
    SUMMARY_FILE,
    TRAINING_KEYS,
    StudyConfig,
    needle_draw_of,
    ppl_eval_tokens,
    training_settings,
    upgrade_settings,
)
from posbias.study.data import prepare_data, split_heldout  # noqa: F401
from posbias.study.estimate import estimate_study
from posbias.study.grid import (
    PPL_FILE,
    TRAIN_PPL_FILE,
    VIEW_FILES,
    eval_tokens_from_corpus,
    evaluate_model,
    run_perplexity,
)
from posbias.study.priors import (
    attention_maps,
    ggd_priors,
    plot_attention_maps,
    plot_priors,
    prior_curves,
    priors_table,
)
from posbias.study.report import write_report  # noqa: F401
from posbias.study.training import (  # noqa: F401
    check_before_training,
    check_training_options,
    default_train_fn,
    ensure_models,
    load_trained,
    model_dir_name,
    prepare_tokenizer,
    study_tokenizer,
    train_config,
    trained_models,
)
from posbias.utils.folder_lock import hold
from posbias.utils.io import atomic_write_json, atomic_write_text
from posbias.utils.run_folder import (
    CONFIG,
    INVOCATIONS,
    announce_resume,
    folder_kind,
    open_run,
    read_run_settings,
    settings_diff,
)


def _ppl_tokens(cfg: StudyConfig, tokenizer, heldout: str | None) -> list[int] | None:
    if not cfg.ppl_contexts or not heldout:
        return None

    return eval_tokens_from_corpus(tokenizer, heldout, cfg.ppl_eval_tokens)


def run_study(cfg: StudyConfig, *, train_fn: Callable | None = None, make_instances: Callable | None = None,
              progress: bool = True, log: Callable = print) -> dict:
    """Train (or reuse) every scheme's model, evaluate it, write metrics, summary and plots.

    Args:
        train_fn: replaces ``posbias.training.train`` (``config -> saved model folder``).
        make_instances: replaces ``posbias.tasks.make_instances`` (tests).
        progress: progress bars, and the time estimate (:mod:`posbias.study.estimate`) before the work.
    Returns: ``{"models": {scheme: path}, "metrics": [...], "summary": path}``.
    """
    out = Path(cfg.out)
    if (out / "config.json").exists() and not cfg.resume:
        raise ValueError(f"{out} already holds a study; pass resume=True to continue it or choose another --out")
    config = study_settings(cfg)
    check_training_options(cfg)
    discard_unfinished(out, config, log=log)
    if has_results(out):  # before the first result, evaluation settings may change freely
        _check_n_grows(out, cfg.n)
        _check_needle_draw(out, cfg.needle_draw)
        _check_ppl_tokens(out, cfg)
    folder = open_run(out, "study", config, check_keys=study_check_keys(out), upgrade=upgrade_settings)
    if folder.resuming and has_results(out):
        announce_resume(len(trained_models(cfg)), len(cfg.schemes), "trained models", out)
    train_corpus, heldout = prepare_data(cfg, log=log, before_write=folder.commit)
    folder.commit()
    tokenizer = prepare_tokenizer(cfg, train_corpus, log=log)
    check_before_training(cfg, tokenizer, passkey_heldout=heldout, make_instances=make_instances)
    if progress:
        todo = [scheme for scheme in cfg.schemes if scheme not in trained_models(cfg)]
        log(estimate_study(cfg, study_tokenizer(tokenizer), todo, passkey_heldout=heldout).describe())
    models = ensure_models(cfg, train_fn=train_fn, corpus=train_corpus, log=log)


    for scheme in cfg.schemes:
        log(f"[study] evaluating {scheme}")
        model, tok = load_trained(models[scheme], cfg.device)
        ppl_tokens = _ppl_tokens(cfg, tok, heldout)
        evaluate_model(model, tok, cfg, name=scheme, passkey_heldout=heldout, ppl_tokens=ppl_tokens,
                       extra={"scheme": scheme}, make_instances=make_instances, progress=progress, log=log)
        if ppl_tokens is not None and train_corpus:
            _training_text_perplexity(cfg, scheme, model, tok, train_corpus)
        _model_views(cfg, scheme, model, tok, make_instances=make_instances, log=log)
        del model
    metrics = write_report(cfg)
    return {"models": models, "metrics": metrics, "summary": str(out / SUMMARY_FILE)}


def _training_text_perplexity(cfg: StudyConfig, scheme: str, model, tokenizer, train_corpus: str) -> None:
    """Perplexity at the training context (non-overlapping) on the last ``ppl_eval_tokens`` tokens of
    the *training* text, into ``perplexity-train.jsonl``: beside the held-out figure it shows how much
    of a model's perplexity is memorisation of a small corpus (the trainer permutes its blocks every
    epoch, so after one epoch the tail has been seen as often as any other part). Skipped when done."""

    ids = eval_tokens_from_corpus(tokenizer, train_corpus, cfg.ppl_eval_tokens)
    run_perplexity(model, ids, model_name=scheme, out_jsonl=Path(cfg.out) / TRAIN_PPL_FILE,
                   contexts=[cfg.train_context], modes=("non-overlapping",),
                   extra={"scheme": scheme, "text": "training"})


RESULT_FILES = (MODELS_FILE, METRICS_FILE, PPL_FILE, TRAIN_PPL_FILE, *(f for _v, _t, f in VIEW_FILES))
DERIVED = (DATA_DIR, "tokenizer", "models")  # what a study derives before its first result


def has_results(out: Path) -> bool:
    """Whether the study folder ``out`` holds a trained model or a score."""
    return any((out / f).exists() for f in RESULT_FILES)


def study_check_keys(out: Path) -> tuple[str, ...]:
    """The settings a run into ``out`` must share with the study there: all of :data:`CHECK_KEYS` once
    it holds a result; none before (:func:`discard_unfinished` has already removed the training of
    other training settings, and evaluation settings may change until something is scored)."""
    return CHECK_KEYS if has_results(out) else ()


def discard_unfinished(out: Path, config: dict, log: Callable = print) -> None:
    """A study that produced no result (no trained model, no score) does not lock its folder: when
    its *training* settings differ (:func:`posbias.study.config.training_settings`; e.g. a corpus too
    small for the training context was rejected while training), the inputs it derived (corpus split,
    tokenizer, unfinished model folders) and its config are removed, saying so in one line, so the
    corrected command starts afresh. An evaluation-only change (depths, perplexity tokens, a logging
    option) keeps the partial training, which the run resumes. Nothing else is touched."""


    path = out / CONFIG
    if folder_kind(out) != "study" or has_results(out):
        return
    old = training_settings(upgrade_settings(read_run_settings(out)))
    diff = settings_diff(old, training_settings(json.loads(json.dumps(config))), (*TRAINING_KEYS, "ppl_eval_tokens"))
    if not diff:
        return
    hold(out)  # never under a study that is training there now
    removed = [name for name in DERIVED if (out / name).exists()]
    for name in removed:
        shutil.rmtree(out / name, ignore_errors=True)
    (out / INVOCATIONS).unlink(missing_ok=True)
    path.unlink()
    log(f"[study] {out}: training settings changed ({'; '.join(diff)}); its unfinished training "
        f"({', '.join(f'{n}/' for n in removed) or 'settings only'}) was removed and training starts afresh")


def _check_n_grows(out: Path, n: int) -> None:
    """A resume may raise ``n`` (instance ``i`` of a cell is the same for every ``n``, so only the
    new instances are scored) but not lower it (the finished cells would hold more than ``n``)."""
    old = _saved_config(out).get("n")
    if old is not None and n < old:
        raise ValueError(f"{out} holds a study with n = {old} per cell; a resume can raise n, not lower it "
                         f"(got n = {n})")


def _check_needle_draw(out: Path, needle_draw: str) -> None:
    """A study keeps its needle draw (:func:`posbias.study.config.needle_draw_of`): the two draws'
    instances would otherwise be pooled in one cell."""
    old = _saved_config(out)
    if old and needle_draw_of(old) != needle_draw:
        raise ValueError(f"{out} asks its needles with --needle-draw {needle_draw_of(old)}; these "
                         f"settings ask --needle-draw {needle_draw}: keep it, or start another --out")


def _saved_config(out: Path) -> dict:
    """The settings an earlier invocation recorded in ``out/config.json`` (empty when there is none)."""

    return read_run_settings(out) if folder_kind(out) == "study" else {}


def study_settings(cfg: StudyConfig) -> dict:
    """The settings an invocation records and checks (``cfg.to_dict()``). One that measures no
    perplexity (``--ppl-multipliers ''``, e.g. to add far cells only) keeps the held-out size its
    folder recorded: the folder's corpus split stays in use, so it resumes any study."""

    config = cfg.to_dict()
    if config["ppl_eval_tokens"] is None:
        config["ppl_eval_tokens"] = ppl_eval_tokens(_saved_config(Path(cfg.out)))
    return config


def _check_ppl_tokens(out: Path, cfg: StudyConfig) -> None:
    """A resume may change the perplexity contexts (``--ppl-multipliers``; finished ones are skipped,
    none at all is fine) as long as perplexity stays measured on the same held-out tokens
    (:func:`ppl_eval_tokens`; also for folders written before that setting was recorded)."""

    old_cfg = _saved_config(out)
    old, new = ppl_eval_tokens(old_cfg), cfg.ppl_eval_tokens
    if old_cfg and new is not None and old != new:
        hint = (f"pass --ppl-tokens {old}" if old is not None else
                "this study measured no perplexity" + ("" if old_cfg.get("heldout") else
                                                       ", so its models trained on the whole corpus")
                + "; start another --out")
        raise ValueError(f"{out} measured perplexity on {old} held-out tokens; these settings would use {new} "
                         f"(--ppl-multipliers {cfg.ppl_multipliers}, --ppl-tokens {cfg.ppl_tokens}): {hint}")


def _write_prior_curves(cfg: StudyConfig, name: str, model) -> None:
    """``priors/<name>-curves.json``: every head's learned bias (any prior: GGD, ALiBi, KERPLE, FIRE) at ~60
    distances from 0 to the longest length, for a query at the training context and at the longest length
    (FIRE depends on the query's position; the others give the same curve twice)."""
    longest = max(cfg.lengths)
    grid = sorted({0, *(round(10 ** (k / 60 * math.log10(longest))) for k in range(61))})
    curves = {f"query_at_{i}": prior_curves(model, [d for d in grid if d <= i], query_position=i)
              for i in sorted({cfg.train_context, longest})}
    if any(curves.values()):
        atomic_write_json(Path(cfg.out) / "priors" / f"{name}-curves.json", curves)


def _model_views(cfg: StudyConfig, scheme: str, model, tokenizer, *, make_instances=None, log=print) -> None:
    """GGD prior plot + table, and attention maps on one passkey instance at the training length."""

    plots = Path(cfg.out) / "plots"
    name = model_dir_name(scheme)
    priors = ggd_priors(model)
    _write_prior_curves(cfg, name, model)
    if (plots / f"attention_{name}.png").exists() and (not priors or (plots / f"priors_{name}.png").exists()):
        return  # done by an earlier invocation (the model has not changed since)
    if priors:
        plot_priors(priors, plots / f"priors_{name}.png", max_distance=max(cfg.lengths),
                    title=f"learned GGD priors: {scheme}")
        atomic_write_text(Path(cfg.out) / "priors" / f"{name}.md", priors_table(priors))
        atomic_write_json(Path(cfg.out) / "priors" / f"{name}.json", priors)
    try:

        inst = grid_instances(tokenizer, task="passkey", length=cfg.train_context, depths=[0.5], n=1,
                              seed=cfg.seed, make_instances=make_instances)[0]
        enc = encode(tokenizer, inst, False)
        ids = enc.prompt_ids + enc.answer_ids
        attn = attention_maps(model, ids)
        n_layers, n_heads = attn.shape[:2]
        layers = sorted({0, n_layers // 2, n_layers - 1})
        needle = _needle_token(tokenizer, enc.prompt_ids, inst.answers[0])
        marks = {"needle": needle} if needle is not None else {}
        plot_attention_maps(attn, plots / f"attention_{name}.png", layers=layers, heads=list(range(min(8, n_heads))),
                            title=f"{scheme}: passkey at depth 0.5, {len(ids)} tokens", marks=marks)
    except Exception as e:  # a view must never cost the study its results
        log(f"[study] attention maps for {scheme} skipped: {type(e).__name__}: {e}")


def _needle_token(tokenizer, prompt_ids: Sequence[int], key: str) -> int | None:
    """Token index where the passkey first appears in the prompt (approximate, for plot marks)."""
    text = ""
    for i, t in enumerate(prompt_ids):
        text += tokenizer.decode([t])
        if key in text:
            return i
    return None
