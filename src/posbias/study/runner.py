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
   locally).
4. ``metrics.jsonl`` (one line per cell / curve point, rewritten at the end), ``summary.md``
   (accuracy by length per scheme, perplexity tables, the learned GGD priors) and PNGs in
   ``plots/``: heatmaps per scheme, accuracy against length, perplexity against length, the
   learned GGD priors and attention maps on one passkey instance.

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
        --multipliers 1,2,4,8,16,32,64,128 --depths 0,0.25,0.5,0.75,1 --n 10 --niah --resume

(The paper's budget is 589,824 tokens per step: ``--train-opt batch_size=64 --train-opt
grad_accum=18``.) The 1000x point (512K tokens) costs far more than the rest of the grid; run
it afterwards for the schemes that are still alive at 128x, e.g. ``--schemes ggd+ssmax
--multipliers 256,512,1000 --resume`` on the same ``--out`` (same training settings: the
models are reused and the new cells appended).

(``benchmarks/extrapolation.py`` takes the same arguments.) Rerunning the same command resumes:
trained models are reused and finished grid cells skipped; ``config.json`` refuses a rerun whose
training settings differ.
"""
from __future__ import annotations

import dataclasses
import inspect
import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from posbias.study.grid import (DEFAULT_DEPTHS, DEFAULT_MULTIPLIERS, DEFAULT_PPL_MULTIPLIERS, DEFAULT_SCHEMES,
                                NIAH_FILE, PASSKEY_FILE, PPL_FILE, grid_lengths, parse_scheme, parse_schemes)
from posbias.evaluation.modes import canonical_mode
from posbias.utils.io import atomic_write_json, atomic_write_text, read_jsonl
from posbias.utils.run_folder import open_run

MODELS_FILE = "models.json"
METRICS_FILE = "metrics.jsonl"
SUMMARY_FILE = "summary.md"
CHECK_KEYS = ("preset", "train_steps", "train_context", "seed", "corpus", "heldout", "passkey_rate", "depths",
              "train_options", "tokenizer",
              "ppl_multipliers", "ppl_tokens")
DATA_DIR = "data"
HELDOUT_CHARS_PER_TOKEN = 6  # generous: English BPE averages ~4-5 characters per token
MAX_HELDOUT_FRACTION = 0.3


@dataclass
class StudyConfig:
    """Settings of one study (see the module docstring)."""

    out: str
    preset: str = "tiny"
    schemes: list[str] = field(default_factory=lambda: list(DEFAULT_SCHEMES))
    train_steps: int | None = None
    train_context: int = 512
    multipliers: list[float] = field(default_factory=lambda: list(DEFAULT_MULTIPLIERS))
    depths: list[float] = field(default_factory=lambda: list(DEFAULT_DEPTHS))
    n: int = 5
    seed: int = 0
    corpus: str | None = None
    heldout: str | None = None
    passkey_rate: float | None = 0.1
    niah: bool = False
    niah_options: dict = field(default_factory=dict)
    modes: list[str] = field(default_factory=lambda: ["teacher-forced", "generate"])
    ppl_multipliers: list[float] = field(default_factory=lambda: list(DEFAULT_PPL_MULTIPLIERS))
    ppl_tokens: int | None = None
    batch_size: int = 4
    token_budget: int = 8192
    device: str = "auto"
    train_options: dict = field(default_factory=dict)
    train_workers: int = 1  # schemes trained at once, in separate processes
    tokenizer: str | None = None  # None = the trainer's (SmolLM2's); "bpe:<N>" = one BPE trained on the training split
    resume: bool = False

    def __post_init__(self):
        self.schemes = parse_schemes(self.schemes)
        self.modes = [canonical_mode(m) for m in self.modes]
        self.multipliers = [float(m) for m in self.multipliers]
        self.depths = [float(d) for d in self.depths]
        self.ppl_multipliers = [float(m) for m in self.ppl_multipliers]
        if self.n < 1:
            raise ValueError(f"n must be >= 1, got {self.n}")
        if self.train_workers < 1:
            raise ValueError(f"train_workers must be >= 1, got {self.train_workers}")
        if self.train_steps is not None and self.train_steps < 1:
            raise ValueError(f"train_steps must be >= 1, got {self.train_steps}")
        grid_lengths(self.train_context, self.multipliers)  # validates

    @property
    def lengths(self) -> list[int]:
        return grid_lengths(self.train_context, self.multipliers)

    @property
    def ppl_contexts(self) -> list[int]:
        return grid_lengths(self.train_context, self.ppl_multipliers) if self.ppl_multipliers else []

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


# ----------------------------------------------------------------------------- training

def model_dir_name(scheme: str) -> str:
    return scheme.replace("+", "_")


def default_train_fn() -> Callable:
    from posbias.training import train

    return train


def train_config(cfg: StudyConfig, scheme: str, out_dir: Path, corpus: str | None = None) -> Any:
    """The training config of ``scheme``: identical for every scheme except ``pe`` / ``ssmax``.

    A :class:`posbias.training.TrainConfig` (fields matched by name; a plain dict when the
    trainer has no config class). ``resume`` is set when ``out_dir`` already exists, so a study
    killed mid-training continues from the trainer's last checkpoint.
    """
    pe, normaliser = parse_scheme(scheme)
    corpus = corpus if corpus is not None else cfg.corpus
    tokenizer = cfg.tokenizer
    if tokenizer is not None and (_tokenizer_dir(cfg) / "tokenizer.json").exists():
        tokenizer = str(_tokenizer_dir(cfg).resolve())
    values = {"pe": pe, "normaliser": normaliser, "ssmax": normaliser == "ssmax", "preset": cfg.preset,
              "tokenizer": tokenizer,
              "steps": cfg.train_steps, "context": cfg.train_context, "seed": cfg.seed,
              "corpus": [corpus] if corpus is not None else None, "passkey_rate": cfg.passkey_rate,
              "device": cfg.device, "out": str(out_dir), "resume": out_dir.exists() and any(out_dir.iterdir()),
              **cfg.train_options}
    values = {k: v for k, v in values.items() if v is not None}
    cls = _train_config_class()
    if cls is None:
        return values
    names = {f.name for f in dataclasses.fields(cls)} if dataclasses.is_dataclass(cls) else \
        set(inspect.signature(cls).parameters)
    unknown = sorted(set(cfg.train_options) - names)
    if unknown:
        raise ValueError(f"unknown training option(s) {unknown}; known: {', '.join(sorted(names))}")
    return cls(**{k: v for k, v in values.items() if k in names})


def _train_config_class():
    try:
        import posbias.training as training
    except ImportError:
        return None
    return getattr(training, "TrainConfig", None)


def _tokenizer_dir(cfg: StudyConfig) -> Path:
    """Where a study-trained tokenizer (``bpe:<N>``) lives."""
    return Path(cfg.out) / "tokenizer"


def prepare_tokenizer(cfg: StudyConfig, corpus: str | None, log: Callable = print) -> str | None:
    """The tokenizer every scheme trains with: ``cfg.tokenizer`` as given, except ``"bpe:<N>"``,
    which is trained once on the training split into ``<out>/tokenizer`` (reused on resume) so
    all schemes share exactly the same vocabulary."""
    from posbias.training.tokenizer import parse_bpe_spec, resolve_tokenizer_spec

    if parse_bpe_spec(cfg.tokenizer) is None:
        return cfg.tokenizer
    target = _tokenizer_dir(cfg)
    if not (target / "tokenizer.json").exists():
        log(f"[study] training tokenizer {cfg.tokenizer} -> {target}")
    return str(Path(resolve_tokenizer_spec(cfg.tokenizer, _load_texts(corpus), target)).resolve())


def ensure_models(cfg: StudyConfig, *, train_fn: Callable | None = None, corpus: str | None = None,
                  log: Callable = print) -> dict[str, str]:
    """Train every scheme not trained yet; returns ``{scheme: model folder}`` (saved in models.json).

    With ``cfg.train_workers > 1`` the schemes train in that many processes at once (each with
    an equal share of the CPU threads); results are recorded as each one finishes, so a killed
    study keeps every finished model and resumes the others from their checkpoints.
    """
    out = Path(cfg.out)
    path = out / MODELS_FILE
    models: dict[str, str] = json.loads(path.read_text()) if path.exists() else {}
    todo = []
    for scheme in cfg.schemes:
        known = models.get(scheme)
        if known and (_resolve(out, known) / "config.json").exists():
            models[scheme] = str(_resolve(out, known))
        else:
            todo.append(scheme)

    def record(scheme: str, result, target: Path, seconds: float) -> None:
        model_path = Path(result) if result is not None else target
        if not (model_path / "config.json").exists():
            raise RuntimeError(f"training {scheme} returned {model_path}, which holds no saved model (config.json)")
        models[scheme] = str(model_path)
        atomic_write_json(path, {k: _relative(out, v) for k, v in models.items()})
        log(f"[study] trained {scheme} in {seconds:.0f}s")

    jobs = [(scheme, out / "models" / model_dir_name(scheme)) for scheme in todo]
    for scheme, target in jobs:
        log(f"[study] training {scheme} -> {target}")
    if cfg.train_workers > 1 and len(jobs) > 1:
        _train_parallel(cfg, jobs, train_fn, corpus, record)
    else:
        fn = train_fn or default_train_fn()
        for scheme, target in jobs:
            t0 = time.time()
            record(scheme, fn(train_config(cfg, scheme, target, corpus)), target, time.time() - t0)
    return models


def _train_parallel(cfg: StudyConfig, jobs, train_fn, corpus, record) -> None:
    """Run the training jobs in ``cfg.train_workers`` spawned processes (``train_fn`` must be picklable)."""
    import multiprocessing as mp
    import os
    from concurrent.futures import ProcessPoolExecutor, as_completed

    workers = min(cfg.train_workers, len(jobs))
    threads = max(1, (os.cpu_count() or 1) // workers)
    fn = train_fn or default_train_fn()
    with ProcessPoolExecutor(workers, mp_context=mp.get_context("spawn"), initializer=_worker_init,
                             initargs=(threads,)) as pool:
        futures = {pool.submit(_timed_call, fn, train_config(cfg, scheme, target, corpus)): (scheme, target)
                   for scheme, target in jobs}
        for fut in as_completed(futures):
            scheme, target = futures[fut]
            result, seconds = fut.result()
            record(scheme, result, target, seconds)


def _worker_init(threads: int) -> None:
    import torch

    torch.set_num_threads(threads)


def _timed_call(fn: Callable, config) -> tuple[Any, float]:
    t0 = time.time()
    result = fn(config)
    return result, time.time() - t0


def _relative(out: Path, p: str | Path) -> str:
    """``p`` relative to the study folder when inside it (so a study folder can be moved)."""
    try:
        return str(Path(p).resolve().relative_to(out.resolve()))
    except ValueError:
        return str(Path(p).resolve())


def _resolve(out: Path, p: str) -> Path:
    return Path(p) if Path(p).is_absolute() else out / p


def load_trained(path: str | Path, device: str = "auto"):
    """``(model, tokenizer)`` from a trained model folder, in eval mode."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import posbias.bam  # noqa: F401  (registers model_type "posbias-bam" with the Auto classes)

    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    model = AutoModelForCausalLM.from_pretrained(path).to(device).eval()
    tok = AutoTokenizer.from_pretrained(path)
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return model, tok


# ----------------------------------------------------------------------------- data

def _load_texts(corpus: str | None) -> list[str]:
    """The corpus documents as the trainer reads them (the built-in essays when ``corpus`` is None)."""
    from posbias.utils.corpus import load_texts

    return load_texts(corpus)


def prepare_data(cfg: StudyConfig, log: Callable = print, before_write: Callable = lambda: None
                 ) -> tuple[str | None, str | None]:
    """Split the corpus into a training part and a held-out part for perplexity.

    Returns ``(training corpus path or None for the trainer's default, held-out text path or
    None)``. With ``--heldout`` the corpus is used as is. Otherwise documents are taken from the
    *end* of the corpus (the last one cut at a character boundary if needed) until about
    ``HELDOUT_CHARS_PER_TOKEN x`` the perplexity token budget (at most 30% of the corpus) is
    held out; both parts are written once to ``<out>/data/{train,heldout}.jsonl`` (reused on
    resume) and every scheme trains on the same ``train.jsonl``. No perplexity contexts: no split.
    The split is computed (and a corpus too small for it refused) before ``before_write()`` runs
    and anything is written, so a rejected corpus never locks the run folder.
    """
    if cfg.heldout:
        return cfg.corpus, cfg.heldout
    if not cfg.ppl_contexts:
        return cfg.corpus, None
    data = Path(cfg.out) / DATA_DIR
    train_path, held_path = data / "train.jsonl", data / "heldout.jsonl"
    if train_path.exists() and held_path.exists():
        return str(train_path.resolve()), str(held_path.resolve())
    train, held, got = split_heldout(cfg, log)
    before_write()
    atomic_write_text(train_path, "".join(json.dumps({"text": t}) + "\n" for t in train if t.strip()))
    atomic_write_text(held_path, "".join(json.dumps({"text": t}) + "\n" for t in held if t.strip()))
    log(f"[study] corpus split: {len(train)} documents for training, {got} characters held out for perplexity")
    return str(train_path.resolve()), str(held_path.resolve())


def split_heldout(cfg: StudyConfig, log: Callable = print) -> tuple[list[str], list[str], int]:
    """``(training documents, held-out documents, held-out characters)`` (see :func:`prepare_data`)."""
    texts = _load_texts(cfg.corpus)
    total = sum(len(t) for t in texts)
    want = (cfg.ppl_tokens or 4 * max(cfg.ppl_contexts)) * HELDOUT_CHARS_PER_TOKEN
    if want > MAX_HELDOUT_FRACTION * total:
        log(f"[study] corpus has {total} characters: holding out {MAX_HELDOUT_FRACTION:.0%} of it for perplexity "
            f"instead of ~{want}; the longest perplexity contexts may get few windows")
        want = int(MAX_HELDOUT_FRACTION * total)
    train, held, got = list(texts), [], 0
    while train and got < want:
        doc = train.pop()
        need = want - got
        if len(doc) > need and len(doc) - need > 0:
            train.append(doc[: len(doc) - need])
            doc = doc[len(doc) - need:]
        held.insert(0, doc)
        got += len(doc)
    if not train:
        raise ValueError("corpus too small to hold out text for perplexity; pass --ppl-multipliers '' or --heldout")
    return train, held, got


# ----------------------------------------------------------------------------- evaluation

def _ppl_tokens(cfg: StudyConfig, tokenizer, heldout: str | None) -> list[int] | None:
    if not cfg.ppl_contexts or not heldout:
        return None
    from posbias.study.grid import eval_tokens_from_corpus

    return eval_tokens_from_corpus(tokenizer, heldout, cfg.ppl_tokens or 4 * max(cfg.ppl_contexts))


def run_study(cfg: StudyConfig, *, train_fn: Callable | None = None, make_instances: Callable | None = None,
              progress: bool = True, log: Callable = print) -> dict:
    """Train (or reuse) every scheme's model, evaluate it, write metrics, summary and plots.

    Args:
        train_fn: replaces ``posbias.training.train`` (``config -> saved model folder``).
        make_instances: replaces ``posbias.tasks.make_instances`` (tests).
    Returns: ``{"models": {scheme: path}, "metrics": [...], "summary": path}``.
    """
    out = Path(cfg.out)
    if (out / "config.json").exists() and not cfg.resume:
        raise ValueError(f"{out} already holds a study; pass --resume to continue it or choose another --out")
    config = cfg.to_dict()
    _check_n_grows(out, cfg.n)
    discard_unfinished(out, config)
    folder = open_run(out, "study", config, check_keys=CHECK_KEYS)
    train_corpus, heldout = prepare_data(cfg, log=log, before_write=folder.commit)
    folder.commit()
    prepare_tokenizer(cfg, train_corpus, log=log)
    models = ensure_models(cfg, train_fn=train_fn, corpus=train_corpus, log=log)

    from posbias.study.grid import evaluate_model

    for scheme in cfg.schemes:
        log(f"[study] evaluating {scheme}")
        model, tok = load_trained(models[scheme], cfg.device)
        ppl_tokens = _ppl_tokens(cfg, tok, heldout)
        evaluate_model(model, tok, name=scheme, out=out, lengths=cfg.lengths, depths=cfg.depths, n=cfg.n,
                       seed=cfg.seed, modes=cfg.modes, niah=cfg.niah, niah_options=cfg.niah_options,
                       ppl_tokens=ppl_tokens, ppl_contexts=cfg.ppl_contexts, batch_size=cfg.batch_size,
                       token_budget=cfg.token_budget, extra={"scheme": scheme},
                       make_instances=make_instances, progress=progress)
        _model_views(cfg, scheme, model, tok, make_instances=make_instances, log=log)
        del model
    metrics = write_report(cfg)
    return {"models": models, "metrics": metrics, "summary": str(out / SUMMARY_FILE)}


RESULT_FILES = (MODELS_FILE, METRICS_FILE, PASSKEY_FILE, NIAH_FILE, PPL_FILE)
DERIVED = (DATA_DIR, "tokenizer", "models")  # what a study derives before its first result


def discard_unfinished(out: Path, config: dict) -> None:
    """A study that produced no result (no trained model, no score) does not lock its folder: when
    the settings differ (e.g. a corpus too small for the training context was rejected while training),
    the inputs it derived (corpus split, tokenizer, unfinished model folders) and its config are
    removed, so the corrected command starts afresh. Nothing else is touched."""
    import shutil

    from posbias.utils.run_folder import CONFIG, folder_kind, settings_diff

    path = out / CONFIG
    if folder_kind(out) != "study" or any((out / f).exists() for f in RESULT_FILES):
        return
    old = json.loads(path.read_text()).get("config", {})
    if not settings_diff(old, json.loads(json.dumps(config)), CHECK_KEYS):
        return
    for name in DERIVED:
        shutil.rmtree(out / name, ignore_errors=True)
    path.unlink()


def _check_n_grows(out: Path, n: int) -> None:
    """A resume may raise ``n`` (instance ``i`` of a cell is the same for every ``n``, so only the
    new instances are scored) but not lower it (the finished cells would hold more than ``n``)."""
    path = out / "config.json"
    if path.exists():
        old = json.loads(path.read_text()).get("config", {}).get("n")
        if old is not None and n < old:
            raise ValueError(f"{out} holds a study with n = {old} per cell; a resume can raise n, not lower it "
                             f"(got n = {n})")


def _model_views(cfg: StudyConfig, scheme: str, model, tokenizer, *, make_instances=None, log=print) -> None:
    """GGD prior plot + table, and attention maps on one passkey instance at the training length."""
    from posbias.study.priors import attention_maps, ggd_priors, plot_attention_maps, plot_priors, priors_table

    plots = Path(cfg.out) / "plots"
    name = model_dir_name(scheme)
    priors = ggd_priors(model)
    if (plots / f"attention_{name}.png").exists() and (not priors or (plots / f"priors_{name}.png").exists()):
        return  # done by an earlier invocation (the model has not changed since)
    if priors:
        plot_priors(priors, plots / f"priors_{name}.png", max_distance=max(cfg.lengths),
                    title=f"learned GGD priors: {scheme}")
        atomic_write_text(Path(cfg.out) / "priors" / f"{name}.md", priors_table(priors))
        atomic_write_json(Path(cfg.out) / "priors" / f"{name}.json", priors)
    try:
        from posbias.evaluation.batching import encode
        from posbias.evaluation.long_context import grid_instances

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


# ----------------------------------------------------------------------------- report

def write_report(cfg: StudyConfig) -> list[dict]:
    """Aggregate the jsonl results into metrics.jsonl, summary.md and the PNGs; returns the metrics."""
    from posbias.evaluation.long_context import accuracy_by_length, summarize_grid
    from posbias.study.plots import plot_accuracy_vs_length, plot_heatmap, plot_perplexity_vs_length

    out = Path(cfg.out)
    plots = out / "plots"
    # every model of the study folder, not only this invocation's (a later run may add lengths
    # for a few schemes only); this invocation's schemes first, in their order
    schemes = list(cfg.schemes)
    models_file = out / MODELS_FILE
    if models_file.exists():
        schemes += [m for m in json.loads(models_file.read_text()) if m not in schemes]
    lengths = sorted({int(r["length"]) for f in (PASSKEY_FILE, NIAH_FILE) for r in read_jsonl(out / f)}
                     | set(cfg.lengths))
    metrics: list[dict] = []
    options = ", ".join(f"{k}={v}" for k, v in sorted(cfg.train_options.items())) or "none"
    sections = [f"# Length-extrapolation study\n\npreset `{cfg.preset}`, training context {cfg.train_context}, "
                f"steps {cfg.train_steps or 'trainer default'}, seed {cfg.seed}, corpus `{cfg.corpus or 'trainer default'}`, "
                f"tokenizer `{cfg.tokenizer or 'trainer default'}`, passkey rate {cfg.passkey_rate}, "
                f"training options: {options}; n = {cfg.n} per cell, depths {cfg.depths}.\n"]
    training = _training_table(out, schemes)
    if training:
        sections.append(training)
    for task, fname in (("passkey", PASSKEY_FILE), ("niah", NIAH_FILE)):
        recs = [r for r in read_jsonl(out / fname) if r.get("model") in schemes and int(r["length"]) in lengths]
        if not recs:
            continue
        cells = summarize_grid(recs)
        metrics += [{"kind": f"{task}_cell", **c} for c in cells]
        sizes = sorted({c["n"] for c in cells})
        if sizes != [cfg.n]:  # cells of earlier invocations (other schemes / lengths) may hold fewer
            sections.append(f"Note ({task}): cells hold {sizes[0]}-{sizes[-1]} instances, not {cfg.n} each "
                            f"(see metrics.jsonl, kind {task}_cell, field n).\n")
        for mode, label in (("tf", "teacher-forced"), ("gen", "generation")):
            curves = accuracy_by_length(recs, mode=mode)
            if not curves:
                continue
            for m, by in curves.items():
                metrics += [{"kind": f"{task}_{mode}_by_length", "model": m, "length": L, "acc": a} for L, a in by.items()]
            plot_accuracy_vs_length(curves, plots / f"{task}_{mode}_accuracy_vs_length.png",
                                    title=f"{task} accuracy ({label})", train_context=cfg.train_context)
            sections.append(_accuracy_table(f"{task}, {label} accuracy (%), mean over depths", curves, schemes,
                                            lengths, cfg.train_context))
        for m in schemes:
            rows = [c for c in cells if c["model"] == m]
            for value, label in (("tf_acc", "teacher-forced"), ("gen_acc", "generation")):
                if any(r[value] is not None for r in rows):
                    plot_heatmap(rows, plots / f"{task}_heatmap_{model_dir_name(m)}_{value.split('_')[0]}.png",
                                 title=f"{m}: {task} ({label})", value=value, train_context=cfg.train_context)
    ppl = [r for r in read_jsonl(out / PPL_FILE) if r.get("model") in schemes]
    if ppl:
        metrics += [{"kind": "perplexity", **{k: r[k] for k in ("model", "context", "mode", "ppl", "nll", "tokens")}}
                    for r in ppl]
        plot_perplexity_vs_length(ppl, plots / "perplexity_vs_length.png", train_context=cfg.train_context)
        sections.append(_ppl_table(ppl, schemes))
    priors_dir = out / "priors"
    for m in schemes:
        f = priors_dir / f"{model_dir_name(m)}.md"
        if f.exists():
            sections.append(f"## Learned GGD priors: {m}\n\nbeta = theta_beta, alpha = exp(-theta_alpha / theta_beta) "
                            f"(bias = -|d/alpha|^beta); beta <= 0 marks a head without locality.\n\n{f.read_text()}")
    figs = sorted(p.name for p in plots.glob("*.png")) if plots.exists() else []
    if figs:
        sections.append("## Figures\n\n" + "\n".join(f"- plots/{p}" for p in figs) + "\n")
    atomic_write_text(out / METRICS_FILE, "".join(json.dumps(m) + "\n" for m in metrics))
    atomic_write_text(out / SUMMARY_FILE, "\n".join(sections))
    return metrics


def _training_table(out: Path, schemes: Sequence[str]) -> str:
    """Final training loss (mean of the last 10% of logged steps), tokens and time per scheme,
    read from each model's ``metrics.jsonl`` (trainer runs inside the study folder only; a resumed
    run counts the minutes of its last invocation only), plus the last passkey probe when the
    trainer ran with ``probe_every`` (retrieval at the training length)."""
    rows, probes = [], False
    for m in schemes:
        logged = read_jsonl(out / "models" / model_dir_name(m) / "metrics.jsonl")
        recs = [r for r in logged if "loss" in r]
        if not recs:
            continue
        tail = recs[-max(1, len(recs) // 10):]
        loss = sum(r["loss"] for r in tail) / len(tail)
        last = recs[-1]
        probe = [r for r in logged if r.get("passkey_em") is not None]
        probes = probes or bool(probe)
        probe_cell = f" {100 * probe[-1]['passkey_em']:.0f}% ({probe[-1]['passkey_logprob']:.1f}) |" if probe else " |"
        rows.append((f"| {m} | {last['step']} | {last.get('tokens', 0) / 1e6:.2f}M | {loss:.3f} | "
                     f"{last.get('elapsed_s', 0) / 60:.1f} |", probe_cell))
    if not rows:
        return ""
    head = "| scheme | steps | tokens | final loss | minutes (last invocation) |"
    rule = "|---|---|---|---|---|"
    if probes:
        head += " passkey probe at 1x: exact (log-prob) |"
        rule += "---|"
    return f"## Training\n\n{head}\n{rule}\n" + "\n".join(r + (c if probes else "") for r, c in rows) + "\n"


def _fmt_len(L: int, train_context: int) -> str:
    x = L / train_context
    return f"{L} ({x:g}x)"


def _accuracy_table(title: str, curves: dict, schemes: Sequence[str], lengths: Sequence[int], train_context: int) -> str:
    head = "| scheme | " + " | ".join(_fmt_len(L, train_context) for L in lengths) + " |"
    sep = "|---|" + "---|" * len(lengths)
    rows = []
    for m in schemes:
        by = curves.get(m, {})
        cells = [f"{100 * by[L]:.0f}" if L in by else "" for L in lengths]
        rows.append(f"| {m} | " + " | ".join(cells) + " |")
    return f"## {title}\n\n" + "\n".join([head, sep, *rows]) + "\n"


def _ppl_table(rows: list[dict], schemes: Sequence[str]) -> str:
    contexts = sorted({int(r["context"]) for r in rows})
    parts = ["## Perplexity on held-out text (non-overlapping / sliding window, stride = context/2)\n"]
    head = "| scheme | " + " | ".join(str(c) for c in contexts) + " |"
    sep = "|---|" + "---|" * len(contexts)
    lines = [head, sep]
    for m in schemes:
        cells = []
        for c in contexts:
            v = {r["mode"]: r["ppl"] for r in rows if r["model"] == m and int(r["context"]) == c}
            cells.append(" / ".join(_fmt_ppl(v.get(k)) for k in ("non-overlapping", "sliding")))
        lines.append(f"| {m} | " + " | ".join(cells) + " |")
    return "\n".join(parts + lines) + "\n"


def _fmt_ppl(v) -> str:
    if v is None:
        return "-"
    v = float(v)
    if not math.isfinite(v):
        return "inf"
    return f"{v:.1f}" if v < 1e4 else f"{v:.1e}"
