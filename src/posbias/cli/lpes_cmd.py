"""``posbias search`` / ``apply`` / ``analyze``: LPES per-layer RoPE scaling."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from posbias.cli.common import (
    Count,
    DataPath,
    ExtraOpts,
    Haystack,
    Length,
    ModelOption,
    NumDocs,
    NumKeys,
    NumNeedles,
    Seed,
    friendly_errors,
    parse_numbers,
    task_options,
)


def search_command(
    model: str = ModelOption(),
    task: Optional[str] = typer.Option(None, help="kv | kv-uuid | mdqa | passkey | niah (default: the model's "
                                                  "lost-in-the-middle target, e.g. kv with 100 keys on "
                                                  "qwen2.5-coder-0.5b; kv with 30 keys otherwise)"),
    objective: str = typer.Option("logprob", help="logprob (depth-weighted mean per-token gold log-prob; the "
                                                  "default: it ranks genomes more consistently) | accuracy "
                                                  "(exact match, log-prob tie-break)"),
    shared_context: bool = typer.Option(True, "--shared-context/--no-shared-context",
                                        help="score each search context at every depth from one prefill "
                                             "(kv, multi-key niah); the held-out table is always per question"),
    preset: str = typer.Option("quick", help="quick (~5 min on 2 CPU cores) | standard (~10 min for SmolLM2, ~90 min for Qwen2.5-0.5B on 1 CPU thread) | paper (GPU)"),
    out: str = typer.Option(..., help="run folder (re-running resumes a killed or shorter search)"),
    resume: bool = typer.Option(False, "--resume", hidden=True,
                                help="accepted for old scripts; re-running the command resumes anyway"),
    seed: int = Seed,
    workers: int = Count(1, help="processes (or Ray actors) scoring individuals in parallel, one model each"),
    backend: str = typer.Option("processes", help="processes (this machine) | ray (Ray actors, across nodes)"),
    ray_address: Optional[str] = typer.Option(None, help="ray.init address for --backend ray (e.g. auto)"),
    target: str = typer.Option("rope", help="what the per-layer curve sets: rope (LPES factors) | temperature "
                                            "(attention temperatures, default grid 0.5..2)"),
    curve: str = typer.Option("bezier", help="bezier | linear | step"),
    control_points: int = Count(4, minimum=2, help="number of control points (4 = cubic Bézier)"),
    population: Optional[int] = Count(None, minimum=2, help="override the preset's population"),
    generations: Optional[int] = Count(None, help="override the preset's generations"),
    n_per_depth: Optional[int] = Count(None, help="override the preset's search instances per depth"),
    batch_size: Optional[int] = Count(None, help="override the preset's batch size"),
    weights: Optional[str] = typer.Option(None, help="fitness weights of depths 0,0.5,1 (default equal)"),
    grid: Optional[str] = typer.Option(None, help="factor grid, comma-separated (default: posbias.search.DEFAULT_GRID)"),
    round_to_grid: bool = typer.Option(False, "--round-to-grid", help="snap per-layer factors to the grid"),
    prune: bool = typer.Option(True, "--prune/--no-prune", help="stop scoring individuals that cannot reach the elite"),
    chat: bool = typer.Option(False, "--chat/--no-chat", help="wrap prompts in the tokenizer's chat template"),
    heldout_n: int = Count(20, minimum=0, help="held-out (eval split) instances per depth for the before/after "
                                              "table; 0 skips it"),
    num_keys: Optional[int] = NumKeys, num_docs: Optional[int] = NumDocs, length: Optional[int] = Length,
    path: Optional[str] = DataPath, haystack: Optional[str] = Haystack, num_needles: Optional[int] = NumNeedles,
    opt: Optional[list[str]] = ExtraOpts,
):
    """Search per-layer RoPE factors (LPES GA over a curve; --target temperature: per-layer attention
    temperatures) on the search split of a task, then compare accuracy by depth before / after on
    held-out instances (out/heldout)."""
    from rich.console import Console

    from posbias.search.runner import run_search

    console = Console()
    overrides = {k: v for k, v in {"population": population, "generations": generations,
                                    "n_per_depth": n_per_depth, "batch_size": batch_size}.items() if v is not None}
    topts = task_options(num_keys, num_docs, length, path, haystack, num_needles, opt)
    if task is None:
        from posbias.models.loader import default_search_target

        task, defaults = default_search_target(model)
        topts = {**defaults, **topts}
        console.print(f"search target: {task} {topts} (the model's default; --task to choose another)")
    res = run_search(model, task, out=out, preset=preset, resume=True, seed=seed, workers=workers, curve=curve,
                     control_points=control_points,
                     task_options=topts,
                     weights=parse_numbers(weights, "weights") if weights else None, chat=chat,
                     grid=parse_numbers(grid, "grid") if grid else None, round_to_grid=round_to_grid,
                     overrides=overrides, log=lambda m: console.print(generation_line(m)), prune=prune,
                     backend=backend, ray_address=ray_address, objective=objective,
                     shared_context=shared_context, target=target)
    base = f"{res.baseline_accuracy:.3f}" if res.baseline_accuracy is not None else "n/a"
    console.print(f"best search-split accuracy {res.accuracy:.3f} (unpatched {base}); factors: {res.factors_path}")
    console.print("factors: " + ", ".join(f"{f:.3f}" for f in res.factors))
    if heldout_n > 0:
        from posbias.search.heldout import before_after

        console.print(f"held-out accuracy by depth, before / after ({heldout_n} per depth) -> {Path(out) / 'heldout'}")
        before_after(model=model, task=task, factors_path=res.factors_path, out=Path(out) / "heldout", n=heldout_n,
                     seed=seed, task_options=topts, chat=chat, target=target)
        console.print((Path(out) / "heldout" / "comparison.md").read_text())
    return res


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
    factors: str = typer.Option(..., help="factors file (best_factors.json of a search)"),
    out: str = typer.Option(..., help="output model folder"),
):
    """Write a model folder that posbias.models.load_model reloads with the scaling active."""
    from posbias.models import load_model
    from posbias.patching.rope_scaling import load_factors_file, save_patched_model
    from posbias.utils.run_folder import open_run

    folder = open_run(out, "apply", {})  # empty, new, or a folder this command wrote before
    load_factors_file(factors)  # a bad factors file is refused before the model loads
    m, tok = load_model(model)
    target = save_patched_model(m, tok, factors, folder.path)
    typer.echo(f"wrote {target} (weights + tokenizer + posbias_factors.json; "
               "posbias.models.load_model reloads it with the per-layer scaling)")


def analyze_command(
    model: str = ModelOption(),
    factors: str = typer.Option(..., help="factors file"),
    task: str = typer.Option("kv", help="task whose prompts are fed to the model"),
    out: str = typer.Option(..., help="output folder"),
    n: int = Count(2, help="prompts per depth (depths 0, 0.5, 1)"),
    controls: int = Count(3, help="noisy and shuffled control variants each"),
    sigma: float = typer.Option(0.1, min=0.0, help="noise: factors x exp(N(0, sigma))"),
    seed: int = Seed,
    chat: bool = typer.Option(False, "--chat/--no-chat"),
    num_keys: Optional[int] = NumKeys, num_docs: Optional[int] = NumDocs, length: Optional[int] = Length,
    path: Optional[str] = DataPath, haystack: Optional[str] = Haystack, num_needles: Optional[int] = NumNeedles,
    opt: Optional[list[str]] = ExtraOpts,
):
    """Representation deviation (1 - linear CKA per layer) of found vs noisy vs shuffled factors."""
    import torch

    from posbias.evaluation.batching import prompt_text
    from posbias.evaluation.session import build_instances
    from posbias.models import get_decoder_layers, load_model
    from posbias.patching.rope_scaling import load_factors_file
    from posbias.search.analysis import analysis_table, analyze_scaling, plot_analysis
    from posbias.tasks import precheck_instances
    from posbias.utils.io import atomic_write_json, atomic_write_text
    from posbias.utils.run_folder import open_run

    opts = task_options(num_keys, num_docs, length, path, haystack, num_needles, opt)
    depths = [0.0, 0.5, 1.0]
    folder = open_run(out, "analyze", {"model": model, "factors": factors, "task": task, "n": n, "controls": controls,
                                       "sigma": sigma, "seed": seed, "chat": chat, "task_options": opts})
    load_factors_file(factors)  # checked before the model loads
    insts = precheck_instances(task, n=n, depths=depths, seed=seed, split="eval", **opts)
    m, tok = load_model(model)
    doc = load_factors_file(factors, num_layers=len(get_decoder_layers(m)))
    if insts is None:
        insts = build_instances(m, tok, task, depths, n, seed, "eval", opts)
    inputs = [torch.tensor(tok(prompt_text(tok, i, chat), add_special_tokens=not chat)["input_ids"]) for i in insts]
    res = analyze_scaling(m, inputs, doc["factors"], n_controls=controls, sigma=sigma, seed=seed)
    outdir = folder.commit()
    atomic_write_json(outdir / "analysis.json", res)
    table = analysis_table(res)
    atomic_write_text(outdir / "analysis.md", table)
    plot_analysis(outdir / "analysis.png", res)
    typer.echo(table)
    return res


def register(app: typer.Typer) -> None:
    app.command("search")(friendly_errors(search_command))
    app.command("apply")(friendly_errors(apply_command))
    app.command("analyze")(friendly_errors(analyze_command))
