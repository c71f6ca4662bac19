"""Training the study's models: one per positional scheme, same budget, resumable, optionally in
parallel worker processes; loading a trained one."""
from __future__ import annotations

import dataclasses
import inspect
import time
from concurrent.futures import as_completed
from pathlib import Path
from typing import Any, Callable

import torch

from posbias.models import load_model
from posbias.models.trained import is_saved_model
from posbias.study.config import MODELS_FILE, StudyConfig, read_models_file
from posbias.study.grid import check_grid_fits, parse_scheme
from posbias.training import TrainConfig, train
from posbias.training.data import load_tokenizer
from posbias.training.tokenizer import parse_bpe_spec, resolve_tokenizer_spec
from posbias.utils.corpus import load_texts
from posbias.utils.io import atomic_write_json
from posbias.utils.options import refuse_unknown
from posbias.utils.progress import use_progress_lines
from posbias.utils.workers import spawn_pool


def model_dir_name(scheme: str) -> str:
    return scheme.replace("+", "_")


def default_train_fn() -> Callable:

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
    values = {"pe": pe, "normaliser": normaliser, "ssmax": normaliser.startswith("ssmax"), "preset": cfg.preset,
              "tokenizer": tokenizer,
              "steps": cfg.train_steps, "context": cfg.train_context, "seed": cfg.seed,
              "corpus": [corpus] if corpus is not None else None, "passkey_rate": cfg.passkey_rate,
              "niah_rate": cfg.niah_rate or None,
              "device": cfg.device, "out": str(out_dir), "resume": out_dir.exists() and any(out_dir.iterdir()),
              **cfg.train_options}
    if cfg.model_options:
        values["model_overrides"] = {**cfg.model_options, **values.get("model_overrides", {})}
    if normaliser == "ssmax-content":
        values["model_overrides"] = {**values.get("model_overrides", {}), "ssmax_scope": "content"}
    values = {k: v for k, v in values.items() if v is not None}
    cls = _train_config_class()
    if cls is None:
        return values
    names = {f.name for f in dataclasses.fields(cls)} if dataclasses.is_dataclass(cls) else \
        set(inspect.signature(cls).parameters)
    refuse_unknown(cfg.train_options, names, "training option")
    return cls(**{k: v for k, v in values.items() if k in names})


def check_training_options(cfg: StudyConfig) -> None:
    """Build and validate every scheme's training config now, so a bad ``--train-opt`` (an unknown
    key, a value the trainer refuses) stops the study before it writes anything."""
    for scheme in cfg.schemes:
        config = train_config(cfg, scheme, Path(cfg.out) / "models" / model_dir_name(scheme))
        if hasattr(config, "validate"):
            config.validate()


def _train_config_class():
    """The trainer's config class (tests replace it to pass plain dict configs)."""
    return TrainConfig


def _tokenizer_dir(cfg: StudyConfig) -> Path:
    """Where a study-trained tokenizer (``bpe:<N>``) lives."""
    return Path(cfg.out) / "tokenizer"


def study_tokenizer(spec: str | None):
    """The tokenizer that :func:`prepare_tokenizer`'s ``spec`` names, loaded as the trainer loads it."""
    return load_tokenizer(spec)


def check_before_training(cfg: StudyConfig, tokenizer_spec: str | None, *, passkey_heldout: str | None = None,
                          make_instances: Callable | None = None) -> None:
    """While a scheme is still to train: the grid's shortest cells must fit their prompts
    (:func:`posbias.study.grid.check_grid_fits`, with the tokenizer the models will have)."""
    if set(cfg.schemes) <= set(trained_models(cfg)):
        return
    check_grid_fits(cfg, study_tokenizer(tokenizer_spec), passkey_heldout=passkey_heldout,
                    make_instances=make_instances)


def prepare_tokenizer(cfg: StudyConfig, corpus: str | None, log: Callable = print) -> str | None:
    """The tokenizer every scheme trains with: ``cfg.tokenizer`` as given, except ``"bpe:<N>"``,
    which is trained once on the training split into ``<out>/tokenizer`` (reused on resume) so
    all schemes share exactly the same vocabulary."""

    if parse_bpe_spec(cfg.tokenizer) is None:
        return cfg.tokenizer
    target = _tokenizer_dir(cfg)
    if not (target / "tokenizer.json").exists():
        log(f"[study] training tokenizer {cfg.tokenizer} -> {target}")
    return str(Path(resolve_tokenizer_spec(cfg.tokenizer, load_texts(corpus), target)).resolve())


def ensure_models(cfg: StudyConfig, *, train_fn: Callable | None = None, corpus: str | None = None,
                  log: Callable = print) -> dict[str, str]:
    """Train every scheme not trained yet; returns ``{scheme: model folder}`` (saved in models.json).

    With ``cfg.train_workers > 1`` the schemes train in that many processes at once (each with
    an equal share of the CPU threads); results are recorded as each one finishes, so a killed
    study keeps every finished model and resumes the others from their checkpoints.
    """
    out = Path(cfg.out)
    path = out / MODELS_FILE
    finished = trained_models(cfg)
    models = {**read_models_file(out), **finished}
    todo = [scheme for scheme in cfg.schemes if scheme not in finished]

    def record(scheme: str, result, target: Path, seconds: float) -> None:
        model_path = Path(result) if result is not None else target
        if not is_saved_model(model_path):
            raise RuntimeError(f"training {scheme} ended without a final model in {model_path} (stopped early, "
                               "e.g. by stop_after?); re-run the study to continue its training")
        models[scheme] = str(model_path)
        _record_model(path, scheme, _relative(out, model_path))
        log(f"[study] trained {scheme} in {seconds:.0f}s")

    jobs = [(scheme, out / "models" / model_dir_name(scheme)) for scheme in todo]
    if cfg.train_workers > 1 and len(jobs) > 1:
        workers = min(cfg.train_workers, len(jobs))
        log(f"[study] training {len(jobs)} schemes, {workers} at a time (one process each; progress in lines "
            f"'train <scheme>: N%'): {', '.join(todo)} -> {out / 'models'}")
        _train_parallel(cfg, jobs, train_fn, corpus, record)
    else:
        fn = train_fn or default_train_fn()
        for i, (scheme, target) in enumerate(jobs, 1):
            log(f"[study] training {scheme} ({i} of {len(jobs)}) -> {target}")
            t0 = time.time()
            record(scheme, fn(train_config(cfg, scheme, target, corpus)), target, time.time() - t0)
    return models


def trained_models(cfg: StudyConfig) -> dict[str, str]:
    """``{scheme: model folder}`` of the schemes of ``cfg`` whose model is trained (in ``models.json``
    and saved)."""
    out = Path(cfg.out)
    known = read_models_file(out)
    return {scheme: str(_resolve(out, known[scheme])) for scheme in cfg.schemes
            if known.get(scheme) and is_saved_model(_resolve(out, known[scheme]))}


def _record_model(path: Path, scheme: str, folder: str) -> None:
    """Add one trained model to models.json, re-reading the file first: another study invocation
    on the same folder (e.g. one training a different scheme at the same time) keeps its entries."""
    on_disk = read_models_file(path.parent)
    atomic_write_json(path, {**on_disk, scheme: folder})


def _train_parallel(cfg: StudyConfig, jobs, train_fn, corpus, record) -> None:
    """Run the training jobs in ``cfg.train_workers`` spawned processes (``train_fn`` must be picklable);
    each reports its progress in lines (two bars on one terminal would overwrite each other)."""
    fn = train_fn or default_train_fn()
    with spawn_pool(min(cfg.train_workers, len(jobs)), initializer=use_progress_lines) as pool:
        futures = {pool.submit(_timed_call, fn, train_config(cfg, scheme, target, corpus)): (scheme, target)
                   for scheme, target in jobs}
        for fut in as_completed(futures):
            scheme, target = futures[fut]
            result, seconds = fut.result()
            record(scheme, result, target, seconds)


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
    """``(model, tokenizer)`` from a trained model folder, in eval mode (:func:`posbias.models.load_model`)."""


    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    return load_model(str(path), device=device)
