"""``posbias demo``: the main jobs on the embedded model and data, in minutes on a laptop CPU.

Default: a small position-bias map of SmolLM2-135M (word-key KV retrieval, depth x prompt length, the
model as it is beside one fix), ending with the path of its heatmap. ``--search``: the quick LPES search
on the same task, then accuracy by depth before / after on held-out instances.
"""
from __future__ import annotations

import time
from typing import Optional

import typer

from posbias.cli.common import (
    Count,
    Device,
    ModelOption,
    Revision,
    Seed,
    friendly_errors,
    load_options,
    method_options_from_flags,
    parse_names,
    parse_numbers,
)
from posbias.cli.lpes_cmd import generation_line

DEMO_LENGTHS = "256,512,1024"
DEMO_DEPTHS = "0,0.25,0.5,0.75,1"
DEMO_METHODS = "none,pi@factor=1.1"


def demo_command(
    out: str = typer.Option(None,
                            help="run folder (re-running resumes; default runs/demo-map, with --search runs/demo)"),
    model: str = ModelOption(),
    search: bool = typer.Option(False, "--search", help="the LPES search demo instead of the map: quick search, "
                                                        "then the held-out before / after table"),
    preset: str = typer.Option("quick", help="--search: search preset: quick | standard | paper"),
    n: int = Count(10, help="map: contexts per length (questions per cell); --search: held-out instances per depth"),
    seed: int = Seed,
    device: str = Device,
    dtype: str = typer.Option("float32", "--dtype", help="weights and compute (float32: the README's figures; auto, "
                                                         "bfloat16 or float16 for speed)"),
    revision: Optional[str] = Revision,
):
    """A small position-bias map of the default model (none beside pi), or with --search the LPES search demo."""
    load = load_options(device, dtype, revision)
    if search:
        return search_demo(out="runs/demo" if out is None else out, model=model, preset=preset, n=n, seed=seed,
                           load=load)
    return map_demo(out="runs/demo-map" if out is None else out, model=model, n=n, seed=seed, load=load)


def map_demo(*, out: str, model: str, n: int, seed: int, load) -> None:
    """The map of ``model`` on word-key KV at 256 / 512 / 1,024 tokens, 5 depths, ``none`` and ``pi``."""
    from posbias.evaluation.bias_map import MapConfig, run_map
    from posbias.evaluation.map_plots import heatmap_path
    from posbias.utils.run_folder import out_path

    start = time.time()
    methods = parse_names(DEMO_METHODS)
    options = method_options_from_flags(methods, factors=None, pi_factor=1.1, routers=None, settings=None)
    cfg = MapConfig(model=model, out=out, task="kv", lengths=parse_names(DEMO_LENGTHS),
                    depths=parse_numbers(DEMO_DEPTHS, "depths"), methods=methods, method_options=options, n=n,
                    seed=seed)
    typer.echo(f"position-bias map of {model}: word-key KV at {DEMO_LENGTHS} tokens, depths {DEMO_DEPTHS}, "
               f"methods {DEMO_METHODS}, n = {n} per cell -> {out}")
    run_map(cfg, log=typer.echo, load=load)
    typer.echo((out_path(out) / "map.md").read_text())
    typer.echo(f"wall time: {time.time() - start:.0f} s; the LPES search demo: posbias demo --search")
    typer.echo(f"heatmap: {heatmap_path(cfg)}")


def search_demo(*, out: str, model: str, preset: str, n: int, seed: int, load) -> None:
    """Quick LPES search on the default model and task, then the held-out before/after table."""
    from posbias.models import load_model
    from posbias.models.adapter import refuse_adapter
    from posbias.search.config import SearchConfig
    from posbias.search.heldout import before_after
    from posbias.search.runner import run_search
    from posbias.utils.run_folder import out_path

    start = time.time()
    out_dir = out_path(out)
    load.check(model)
    refuse_adapter(model, "demo --search", "per-layer RoPE factors")  # before the model loads
    loaded = load_model(model, load)
    typer.echo(f"[1/2] LPES search ({preset}) on {model}, task kv (30 word keys) -> {out_dir / 'search'}")
    search = SearchConfig(out=str(out_dir / "search"), model=model, task="kv", preset=preset, seed=seed)
    result = run_search(search, resume=True, loaded=loaded, load=load,
                        log=lambda rec: typer.echo(generation_line(rec)))
    typer.echo(f"[2/2] held-out accuracy by depth, before / after -> {out_dir / 'heldout'}")
    before_after(search, result.factors_path, out_dir / "heldout", n=n, loaded=loaded, load=load)
    typer.echo((out_dir / "heldout" / "comparison.md").read_text())
    typer.echo(f"factors: {result.factors_path}\nplots: {out_dir / 'search'}/*.png, "
               f"{out_dir / 'heldout'}/comparison.png")
    typer.echo(f"wall time: {time.time() - start:.0f} s")


def register(app: typer.Typer) -> None:
    app.command("demo")(friendly_errors(demo_command))
