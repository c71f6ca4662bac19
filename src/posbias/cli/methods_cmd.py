"""``posbias train-moice``: train MoICE routers (only the routers; the model stays frozen)."""
from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Optional

import typer

from posbias.cli.common import (Count, DataPath, ExtraOpts, Haystack, Length, NumDocs, NumKeys, NumNeedles, Seed,
                                friendly_errors, parse_floats, task_options)

DEFAULT_MODEL = "smollm2-135m"


def train_moice_command(
    model: str = typer.Option(DEFAULT_MODEL, help="HF folder, .gguf file or alias"),
    out: str = typer.Option(..., help="folder for routers.safetensors + moice_config.json"),
    steps: int = Count(20, help="optimizer steps (one text per step)"),
    lr: float = typer.Option(1e-4, help="router learning rate"),
    aux_coef: float = typer.Option(0.3, help="load-balancing loss coefficient"),
    data: Optional[str] = typer.Option(None, help="training texts: .jsonl (text, or prompt+answer) or plain text "
                                                  "(blank-line separated); default synthetic passkey documents"),
    length: int = Count(512, help="synthetic passkey document length in tokens (no --data)"),
    max_tokens: int = Count(1024, help="truncate training texts to this many tokens"),
    top_k: int = Count(7, help="experts per head and token (7 = dense, the reference run)"),
    multipliers: str = typer.Option("1.0,1.75,1.8,1.9,2.0,2.25,2.5",
                                    help="expert RoPE bases as multiples of each layer's base (the reference's "
                                         "10000..25000 / 10000)"),
    hidden: Optional[int] = Count(None, help="router hidden size (default: the number of experts, as the reference)"),
    seed: int = Seed,
):
    """Train MoICE routers on a small local dataset and save them (load with --method moice
    --method-opt routers=OUT)."""
    from posbias.methods import apply_method
    from posbias.methods.moice import passkey_texts, read_texts, save_routers, train_routers
    from posbias.models import load_model

    from posbias.utils.run_folder import open_run

    if steps < 1:
        raise ValueError("--steps must be >= 1")
    if lr <= 0:
        raise ValueError("--lr must be > 0")
    settings = {"model": model, "steps": steps, "lr": lr, "aux_coef": aux_coef, "data": data, "length": length,
                "max_tokens": max_tokens, "top_k": top_k, "multipliers": multipliers, "hidden": hidden, "seed": seed}
    folder = open_run(out, "train-moice", settings, check_keys=tuple(settings))  # checked before the model loads
    lm, tok = load_model(model)
    texts = read_texts(data) if data else passkey_texts(max(steps, 1), length, tok, seed=seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        handle = apply_method(lm, "moice", top_k=top_k, multipliers=parse_floats(multipliers, "multipliers"),
                              hidden=hidden, seed=seed)
    log = lambda r: typer.echo(f"step {r['step']:4d}  loss {r['loss']:.4f}  lm {r['lm']:.4f}  aux {r['aux']:.4f}")  # noqa: E731
    history = train_routers(handle, tok, texts, steps=steps, lr=lr, aux_coef=aux_coef, max_tokens=max_tokens,
                            seed=seed, log=log)
    folder.commit()
    folder = save_routers(handle.state["routers"], out, extra={
        "model": model, "steps": steps, "lr": lr, "aux_coef": aux_coef, "data": data or f"synthetic passkey ({length})",
        "seed": seed, "final": history[-1]})
    handle.remove()
    (Path(folder) / "history.json").write_text(json.dumps(history, indent=1))
    typer.echo(f"saved routers to {folder}")
    return folder


def tune_command(
    model: str = typer.Option(DEFAULT_MODEL, help="HF folder, .gguf file or alias"),
    task: str = typer.Option("kv", help="kv | kv-uuid | mdqa | passkey | niah"),
    methods: str = typer.Option("pi,ms-poe,attention-buckets", help="comma-separated methods to tune "
                                                                    "(pi, ms-poe, attention-buckets, moice)"),
    out: str = typer.Option(..., help="tuning folder: results.jsonl, tune.md, best_settings.json (re-running resumes)"),
    n_per_depth: int = Count(8, help="search-split instances (contexts) per depth"),
    routers: Optional[str] = typer.Option(None, help="trained MoICE routers (needed to tune moice)"),
    batch_size: int = Count(8, help="instances per forward pass"),
    seed: int = Seed,
    num_keys: Optional[int] = NumKeys, num_docs: Optional[int] = NumDocs, length: Optional[int] = Length,
    path: Optional[str] = DataPath, haystack: Optional[str] = Haystack, num_needles: Optional[int] = NumNeedles,
    opt: Optional[list[str]] = ExtraOpts,
):
    """Choose each baseline's settings on the search split (a small grid per method), as LPES's search
    chooses its factors; `posbias compare --settings OUT/best_settings.json` uses them."""
    from posbias.evaluation.tune import tune_methods

    names = [m.strip() for m in methods.split(",") if m.strip()]
    base = {"moice": {"routers": routers}} if routers else {}
    best = tune_methods(model=model, task=task, methods=names, n_per_depth=n_per_depth, out=out, seed=seed,
                        batch_size=batch_size, base_options=base, log=typer.echo,
                        task_options=task_options(num_keys, num_docs, length, path, haystack, num_needles, opt))
    typer.echo((Path(out) / "tune.md").read_text())
    typer.echo(f"best settings -> {Path(out) / 'best_settings.json'}: {json.dumps(best)}")
    return best


def register(app: typer.Typer) -> None:
    app.command("train-moice")(friendly_errors(train_moice_command))
    app.command("tune")(friendly_errors(tune_command))
