"""``posbias eval``: accuracy by gold-item depth for one model, task and method."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from posbias.cli.common import (
    DEPTHS_HELP,
    FACTORS_HELP,
    AttentionOption,
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
    method_options_from_flags,
    parse_key_values,
    ready_methods,
    task_options,
)
from posbias.cli.config_file import ConfigFileOption, given_parameters, require, settings_with_file
from posbias.utils.options import field_types, parse_depths, parse_names


def eval_command(
    ctx: typer.Context,
    model: str = ModelOption(),
    task: str = typer.Option("kv", help="kv | kv-uuid | mdqa | passkey | niah"),
    depths: str = typer.Option("0,0.25,0.5,0.75,1", help=DEPTHS_HELP),
    n: int = Count(50, help="instances per depth"),
    out: Optional[str] = typer.Option(None, help="run folder (re-running resumes); required unless --config "
                                                 "names it"),
    seed: int = Seed,
    split: str = typer.Option("eval", help="eval | search (disjoint instance sets)"),
    mode: str = typer.Option("teacher-forced", help="teacher-forced | generate | both"),
    batch_size: int = Count(8, help="instances per forward pass"),
    chat: bool = typer.Option(False, "--chat/--no-chat", help="wrap prompts in the tokenizer's chat template"),
    max_new_tokens: Optional[int] = Count(None, help="greedy generation: tokens generated at most (default: the "
                                                     "longest gold answer's tokens + 4, at least 16)"),
    method: str = typer.Option("none", help="none | pi | lpes | ms-poe | attention-buckets | moice | temperature | "
                                            "positional-hidden"),
    method_opt: Optional[list[str]] = typer.Option(None, "--method-opt", help="method option key=value (repeatable)"),
    factors: Optional[str] = typer.Option(None, help=FACTORS_HELP),
    num_keys: Optional[int] = NumKeys, num_docs: Optional[int] = NumDocs, length: Optional[int] = Length,
    path: Optional[str] = DataPath, haystack: Optional[str] = Haystack, num_needles: Optional[int] = NumNeedles,
    opt: Optional[list[str]] = ExtraOpts,
    attention: bool = AttentionOption,
    device: str = Device, dtype: str = Dtype, revision: Optional[str] = Revision,
    config: Optional[str] = ConfigFileOption(),
):
    """Evaluate accuracy against the depth of the gold item; writes results, summary and plot to --out."""
    from posbias.evaluation.session import EvalConfig, run_eval

    load = load_options(device, dtype, revision)
    method_opts = parse_key_values(method_opt, "method-opt")
    if factors:
        if config is None and method.split("@")[0].strip().lower() != "lpes":  # a --config may name lpes itself
            raise ValueError(f"--factors is the factors file of --method lpes, and --method is {method}: add "
                             "--method lpes (an apply folder given as --model carries its factors itself)")
        method_opts["factors"] = factors
    flags = dict(
        model=model, task=task, depths=parse_depths(depths), n=n, out=out, seed=seed, split=split,
        mode=mode, batch_size=batch_size, chat=chat, max_new_tokens=max_new_tokens, method=method,
        method_options=method_opts, attention=attention,
        task_options=task_options(num_keys, num_docs, length, path, haystack, num_needles, opt),
    )
    settings = settings_with_file(ctx, config, "eval", flags, field_types(EvalConfig))
    require(settings, "out", "--out")
    summary = run_eval(EvalConfig(**settings), load=load)
    typer.echo((Path(settings["out"]).expanduser() / "summary.md").read_text())
    return summary


def compare_command(
    ctx: typer.Context,
    model: str = ModelOption(),
    task: str = typer.Option("kv"),
    methods: Optional[str] = typer.Option(None, help="comma-separated methods or variants (default: none,pi, plus lpes "
                                                     "with --factors and moice with --routers; Ms-PoE and Attention "
                                                     "Buckets on request: at their published settings Ms-PoE scores "
                                                     "0% on the packaged models, Buckets costs 7 passes)"),
    factors: Optional[str] = typer.Option(None, help=FACTORS_HELP),
    pi_factor: float = typer.Option(1.1, help="global factor for pi"),
    routers: Optional[str] = typer.Option(None, help="router weights for moice (posbias train-moice)"),
    settings_file: Optional[str] = typer.Option(None, "--settings",
                                                help="best_settings.json from posbias tune: each listed method's "
                                                     "options (chosen on the search split)"),
    depths: str = typer.Option("0,0.25,0.5,0.75,1", help=DEPTHS_HELP),
    n: int = Count(50, help="instances per depth"),
    out: Optional[str] = typer.Option(None, help="comparison folder, one subfolder per method (re-running "
                                                 "resumes); required unless --config names it"),
    seed: int = Seed,
    mode: str = typer.Option("teacher-forced", help="teacher-forced | generate | both"),
    batch_size: int = Count(8, help="instances per forward pass"),
    chat: bool = typer.Option(False, "--chat/--no-chat"),
    num_keys: Optional[int] = NumKeys, num_docs: Optional[int] = NumDocs, length: Optional[int] = Length,
    path: Optional[str] = DataPath, haystack: Optional[str] = Haystack, num_needles: Optional[int] = NumNeedles,
    opt: Optional[list[str]] = ExtraOpts,
    device: str = Device, dtype: str = Dtype, revision: Optional[str] = Revision,
    config: Optional[str] = ConfigFileOption(),
):
    """Evaluate several methods on the same held-out instances: joint table and plot in --out."""
    from posbias.evaluation.compare import CompareConfig, compare_methods

    load = load_options(device, dtype, revision)
    flags = dict(model=model, task=task, methods=parse_names(methods) if methods else default_methods(factors, routers),
                 depths=parse_depths(depths), n=n,
                 out=out, seed=seed, mode=mode, batch_size=batch_size, chat=chat,
                 task_options=task_options(num_keys, num_docs, length, path, haystack, num_needles, opt))
    settings = settings_with_file(ctx, config, "compare", flags, field_types(CompareConfig))
    require(settings, "out", "--out")
    settings["methods"] = ready_methods(settings["methods"], routers)
    pi_factor_given = config is None or "pi_factor" in (given_parameters(ctx) or ())
    settings["method_options"] = method_options_from_flags(  # the flags given over the file's options
        settings["methods"], factors=factors, pi_factor=pi_factor if pi_factor_given else None, routers=routers,
        settings=settings_file, recorded=settings.get("method_options"))
    compare_methods(CompareConfig(**settings), load=load)
    typer.echo((Path(settings["out"]).expanduser() / "comparison.md").read_text())


def default_methods(factors: str | None, routers: str | None) -> list[str]:
    """``compare``'s methods when ``--methods`` is not given: the model and PI, plus LPES and MoICE when their
    files are given (the methods a user can read something from without tuning first)."""
    return ["none", "pi", *(["lpes"] if factors else []), *(["moice"] if routers else [])]


def register(app: typer.Typer) -> None:
    app.command("eval")(friendly_errors(eval_command))
    app.command("compare")(friendly_errors(compare_command))
