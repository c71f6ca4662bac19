"""``posbias search`` / ``apply`` / ``analyze``: LPES per-layer RoPE scaling."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer

from posbias.cli.common import (
    FACTORS_HELP,
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
    parse_key_values,
    parse_numbers,
    task_options,
)
from posbias.cli.config_file import ConfigFileOption, require, settings_with_file
from posbias.utils.options import field_types, parse_depths


def search_command(
    ctx: typer.Context,
    model: str = ModelOption(),
    task: Optional[str] = typer.Option(None, help="kv | kv-uuid | mdqa | passkey | niah (default: the model's "
                                                  "lost-in-the-middle target, e.g. kv with 100 keys on "
                                                  "qwen2.5-coder-0.5b; kv with 30 keys otherwise)"),
    objective: Optional[str] = typer.Option(None, help="logprob (depth-weighted mean per-token gold log-prob; the "
                                                       "default: it ranks genomes more consistently) | accuracy "
                                                       "(exact match, log-prob tie-break) | greedy (the greedy "
                                                       "answer's task score, log-prob tie-break; the authors "
                                                       "preset's)"),
    shared_context: bool = typer.Option(True, "--shared-context/--no-shared-context",
                                        help="score each search context at every depth from one prefill "
                                             "(kv, multi-key niah); the held-out table is always per question"),
    preset: str = typer.Option("quick",
                               help="quick (~5 min for SmolLM2 on a 2-core x86 CPU) | standard (~10 min for "
                                    "SmolLM2, ~90 min for Qwen2.5-0.5B on 1 CPU thread) | paper (GPU) | authors "
                                    "(the LPES authors' search: their GA, factors 1.0-2.5 from 1.5, greedy "
                                    "accuracy with the gold last; use with --task mdqa; GPU)"),
    out: Optional[str] = typer.Option(None, help="run folder (re-running resumes a killed or shorter search); "
                                                 "required unless --config names it"),
    seed: int = Seed,
    workers: int = Count(1, help="processes (or Ray actors) scoring individuals in parallel, one model each"),
    backend: str = typer.Option("processes", help="processes (this machine) | ray (Ray actors, across nodes)"),
    ray_address: Optional[str] = typer.Option(None, help="ray.init address for --backend ray (e.g. auto)"),
    target: str = typer.Option("rope", help="what the per-layer curve sets: rope (LPES factors) | temperature "
                                            "(attention temperatures, default grid 0.5..2) | rope+temperature "
                                            "(both, two curves in one genome; --grid sets the RoPE one)"),
    curve: Optional[str] = typer.Option(None, help="bezier (default) | bezier-t (the LPES authors' mapping; the "
                                                   "authors preset's) | linear | step"),
    depths: Optional[str] = typer.Option(None, help="depths of the search split's gold item (default 0,0.5,1; the "
                                                    "authors preset: 1)"),
    control_points: int = Count(4, minimum=2, help="number of control points (4 = cubic Bézier)"),
    population: Optional[int] = Count(None, minimum=2, help="override the preset's population"),
    generations: Optional[int] = Count(None, help="override the preset's generations"),
    n_per_depth: Optional[int] = Count(None, help="override the preset's search instances per depth"),
    batch_size: Optional[int] = Count(None, help="override the preset's batch size"),
    weights: Optional[str] = typer.Option(None, help="fitness weights of the search depths (default equal)"),
    grid: Optional[str] = typer.Option(None, help="factor grid, comma-separated (default: posbias.search.DEFAULT_GRID;"
                                                  " the authors preset: 1.0..2.5 by 0.05)"),
    round_to_grid: bool = typer.Option(False, "--round-to-grid", help="snap per-layer factors to the grid"),
    prune: bool = typer.Option(True, "--prune/--no-prune", help="stop scoring individuals that cannot reach the elite"),
    chat: bool = typer.Option(False, "--chat/--no-chat", help="wrap prompts in the tokenizer's chat template"),
    heldout_n: int = Count(20, minimum=0, help="held-out (eval split) instances per depth for the before/after "
                                              "table; 0 skips it"),
    num_keys: Optional[int] = NumKeys, num_docs: Optional[int] = NumDocs, length: Optional[int] = Length,
    path: Optional[str] = DataPath, haystack: Optional[str] = Haystack, num_needles: Optional[int] = NumNeedles,
    opt: Optional[list[str]] = ExtraOpts,
    device: str = Device, dtype: str = Dtype, revision: Optional[str] = Revision,
    config: Optional[str] = ConfigFileOption(),
):
    """Search per-layer RoPE factors (LPES GA over a curve; --target temperature: per-layer attention
    temperatures) on the search split of a task, then compare accuracy by depth before / after on
    held-out instances (out/heldout)."""
    import dataclasses

    from rich.console import Console

    from posbias.search.config import DERIVED_KEYS, SearchConfig
    from posbias.search.runner import check_search_model, run_search

    console = Console() if sys.stdout.isatty() else Console(width=200, soft_wrap=True)  # no wrapping in logs
    load = load_options(device, dtype, revision)
    overrides = {k: v for k, v in {"population": population, "generations": generations,
                                    "n_per_depth": n_per_depth, "batch_size": batch_size}.items() if v is not None}
    flags = dict(out=out, model=model, task=task, preset=preset, seed=seed, workers=workers, curve=curve,
                 control_points=control_points,
                 task_options=task_options(num_keys, num_docs, length, path, haystack, num_needles, opt),
                 weights=parse_numbers(weights, "weights") if weights else None, chat=chat,
                 depths=parse_depths(depths) if depths else None,
                 grid=parse_numbers(grid, "grid") if grid else None, round_to_grid=round_to_grid,
                 overrides=overrides, prune=prune, backend=backend, ray_address=ray_address, objective=objective,
                 shared_context=shared_context, heldout_n=heldout_n, target=target)
    # a written settings file may give the preset's keys as the flags name them: they are overrides
    flags["overrides"] = {**file_overrides(config), **overrides}
    # the GA overrides and task options are dicts: merged key by key with the file's
    flags = settings_with_file(ctx, config, "search", flags, field_types(SearchConfig),
                               ignore=(*DERIVED_KEYS, *PRESET_KEYS))
    require(flags, "out", "--out")
    cfg = SearchConfig(**flags)
    check_search_model(cfg)
    if cfg.task is None:
        from posbias.models.loader import default_search_target

        task, defaults = default_search_target(cfg.model)
        cfg = dataclasses.replace(cfg, task=task, task_options={**defaults, **cfg.task_options})
        console.print(f"search target: {cfg.task} {cfg.task_options} (the model's default; --task to choose another)")
    res = run_search(cfg, resume=True, log=lambda m: console.print(generation_line(m)), load=load)
    base = f"{res.baseline_accuracy:.3f}" if res.baseline_accuracy is not None else "n/a"
    chosen = {"logprob": "log-prob (accuracy breaks ties)", "greedy": "greedy-answer accuracy (log-prob breaks ties)"
              }.get(res.objective, "accuracy (log-prob breaks ties)")
    console.print(f"winner chosen by {chosen}; its search-split accuracy {res.accuracy:.3f} (unpatched {base}); "
                  f"factors: {res.factors_path}")
    if res.below_unpatched:
        console.print(f"[yellow]warning: the winner answers fewer search-split questions than the unpatched model "
                      f"({res.accuracy:.3f} < {base}): chosen by {res.objective}, it is no better at answering here; "
                      "read the held-out table before using it[/yellow]")
    console.print("factors: " + ", ".join(f"{f:.3f}" for f in res.factors))
    if res.temperatures is not None:
        console.print("temperatures: " + ", ".join(f"{t:.3f}" for t in res.temperatures))
    if cfg.heldout_n > 0:
        from posbias.search.heldout import before_after

        heldout = Path(cfg.out) / "heldout"
        console.print(f"held-out accuracy by depth, before / after ({cfg.heldout_n} per depth) -> {heldout}")
        before_after(cfg, res.factors_path, heldout, load=load)
        console.print((heldout / "comparison.md").read_text())
    return res


PRESET_KEYS = ("population", "generations", "n_per_depth", "batch_size")


def file_overrides(path: str | None) -> dict:
    """The preset settings a written search settings file gives at its top level (``generations = 8``, as the
    flags name them) or in a ``ga`` table, as overrides; none from a run folder's config.json, which records
    them beside its own overrides (derived from those, and read back from there)."""
    from posbias.cli.config_file import is_run_config, read_settings_doc

    doc = read_settings_doc(path) if path else {}
    if is_run_config(doc):
        return {}
    ga = doc.get("ga") if isinstance(doc.get("ga"), dict) else {}
    return {**ga, **{k: doc[k] for k in PRESET_KEYS if k in doc}}


def generation_line(m: dict) -> str:
    """One line per GA generation: best / mean fitness, scoring work and wall time."""
    pd = " ".join(f"{d}:{a:.2f}" for d, a in m["best_per_depth"].items())
    value = ""
    if m.get("objective") == "logprob":
        value = f"  {m['objective']} best {m['best_value']:.4f} mean {m['mean_value']:.4f} |"
    return (f"gen {m['generation']:>2} {value} accuracy best {m['best_accuracy']:.3f} ({pd})"
            f"  mean {m['mean_accuracy']:.3f}  scored {m['scored']} (pruned {m['pruned']}, memo {m['memo_hits']})"
            f"  questions {m.get('questions_scored', '?')}  fwd {m['forward_passes']}  {m['wall_s']:.0f}s")


def apply_command(
    model: str = ModelOption(),
    factors: Optional[str] = typer.Option(None, help=f"{FACTORS_HELP}, for lpes"),
    out: str = typer.Option(..., help="output folder (an earlier apply's folder there is replaced)"),
    method: str = typer.Option("lpes", help="lpes | pi | ms-poe | moice (methods that patch the model in place)"),
    method_opt: Optional[list[str]] = typer.Option(None, "--method-opt", help="method option key=value (repeatable)"),
    routers: Optional[str] = typer.Option(None, help="trained MoICE routers (posbias train-moice), for moice: "
                                                     "copied into the folder"),
    merge: bool = typer.Option(False, "--merge", help="write a standalone model folder (weights + tokenizer + "
                                                      "modeling_posbias.py) that transformers loads with the "
                                                      "scaling through trust_remote_code=True (lpes, pi)"),
    device: str = Device, dtype: str = Dtype, revision: Optional[str] = Revision,
):
    """Write the method as an adapter folder (a few KB: settings, factors file, base model) that --model and
    posbias.models.load_model load as base model + method; --merge writes a standalone model folder."""
    from posbias.models import load_model
    from posbias.models.adapter import refuse_adapter
    from posbias.models.export import check_apply_request, write_applied
    from posbias.utils.run_folder import open_run

    load = load_options(device, dtype, revision)
    load.check(model)
    options = parse_key_values(method_opt, "method-opt")
    if factors:
        options["factors"] = factors
    if routers:
        options["routers"] = routers
    open_run(out, "apply", {})  # empty, new, or a folder this command wrote before
    name = check_apply_request(method, options, merge)  # before the model loads
    refuse_adapter(model, "apply", "a method")
    m, tok = load_model(model, load)
    target = write_applied(out, spec=model, model=m, tokenizer=tok, method=name, options=options, merge=merge)
    what = ("a standalone model (weights + tokenizer + modeling_posbias.py; transformers loads it with the "
            "scaling through trust_remote_code=True)" if merge else "an adapter (--model or "
            "posbias.models.load_model loads it as the base model with the method)")
    typer.echo(f"wrote {target}: {name} on {model} as {what}")


# The settings of an analyze run, as its config.json records them (and --config reads them).
ANALYZE_SETTINGS = ("model", "factors", "task", "n", "controls", "sigma", "seed", "chat", "task_options", "out")


def analyze_command(
    ctx: typer.Context,
    model: str = ModelOption(),
    factors: Optional[str] = typer.Option(None, help=f"{FACTORS_HELP}; required unless --config names it"),
    task: str = typer.Option("kv", help="task whose prompts are fed to the model"),
    out: Optional[str] = typer.Option(None, help="output folder; required unless --config names it"),
    n: int = Count(2, help="prompts per depth (depths 0, 0.5, 1)"),
    controls: int = Count(3, help="noisy and shuffled control variants each"),
    sigma: float = typer.Option(0.1, min=0.0, help="noise: factors x exp(N(0, sigma))"),
    seed: int = Seed,
    chat: bool = typer.Option(False, "--chat/--no-chat"),
    num_keys: Optional[int] = NumKeys, num_docs: Optional[int] = NumDocs, length: Optional[int] = Length,
    path: Optional[str] = DataPath, haystack: Optional[str] = Haystack, num_needles: Optional[int] = NumNeedles,
    opt: Optional[list[str]] = ExtraOpts,
    device: str = Device, dtype: str = Dtype, revision: Optional[str] = Revision,
    config: Optional[str] = ConfigFileOption(),
):
    """Representation deviation (1 - linear CKA per layer) of found vs noisy vs shuffled factors."""
    from posbias.search.analysis import analysis_table

    load = load_options(device, dtype, revision)
    flags = dict(model=model, factors=factors, task=task, n=n, controls=controls, sigma=sigma, seed=seed, chat=chat,
                 task_options=task_options(num_keys, num_docs, length, path, haystack, num_needles, opt), out=out)
    settings = settings_with_file(ctx, config, "analyze", flags, ANALYZE_SETTINGS)
    require(settings, "factors", "--factors")
    require(settings, "out", "--out")
    res = analyze_factors(settings, load)
    typer.echo(analysis_table(res))
    return res


def analyze_factors(settings: dict, load) -> dict:
    """The analysis of the :data:`ANALYZE_SETTINGS` ``settings`` into their ``out`` folder
    (``analysis.json``, ``analysis.md``, ``analysis.png``); returns the analysis."""
    import torch

    from posbias.evaluation.batching import prompt_text
    from posbias.evaluation.session import build_instances
    from posbias.models import get_decoder_layers, load_model
    from posbias.models.adapter import refuse_adapter
    from posbias.models.options import load_settings
    from posbias.patching.rope_scaling import load_factors_file
    from posbias.search.analysis import analysis_table, analyze_scaling, plot_analysis
    from posbias.tasks import precheck_instances
    from posbias.utils.io import atomic_write_json, atomic_write_text
    from posbias.utils.run_folder import open_run

    s = settings
    depths = [0.0, 0.5, 1.0]
    refuse_adapter(s["model"], "analyze", "per-layer factors")
    recorded = {k: s[k] for k in ANALYZE_SETTINGS if k != "out"}
    folder = open_run(s["out"], "analyze", {**recorded, "out": str(s["out"]), **load_settings(s["model"], load)})
    target = load_factors_file(s["factors"]).get("target", "rope")  # checked before the model loads
    if target != "rope":
        raise ValueError(f"analyze takes RoPE factors (an LPES search's file); {s['factors']} holds {target} values")
    insts = precheck_instances(s["task"], n=s["n"], depths=depths, seed=s["seed"], split="eval", **s["task_options"])
    m, tok = load_model(s["model"], load)
    doc = load_factors_file(s["factors"], num_layers=len(get_decoder_layers(m)))
    if insts is None:
        insts = build_instances(m, tok, s["task"], depths, s["n"], s["seed"], "eval", s["task_options"])
    inputs = [torch.tensor(tok(prompt_text(tok, i, s["chat"]), add_special_tokens=not s["chat"])["input_ids"])
              for i in insts]
    res = analyze_scaling(m, inputs, doc["factors"], n_controls=s["controls"], sigma=s["sigma"], seed=s["seed"])
    outdir = folder.commit()
    atomic_write_json(outdir / "analysis.json", res)
    atomic_write_text(outdir / "analysis.md", analysis_table(res))
    plot_analysis(outdir / "analysis.png", res)
    return res


def register(app: typer.Typer) -> None:
    app.command("search")(friendly_errors(search_command))
    app.command("apply")(friendly_errors(apply_command))
    app.command("analyze")(friendly_errors(analyze_command))
