"""``posbias demo``: the main job on the embedded model and data, in minutes on a laptop CPU.

Quick LPES search on SmolLM2-135M (word-key KV retrieval, the project's default
lost-in-the-middle setting), then accuracy by depth before / after on held-out instances.
"""
from __future__ import annotations

import time
from typing import Optional

import typer

from posbias.cli.common import Count, Device, Dtype, ModelOption, Revision, Seed, friendly_errors, load_options
from posbias.cli.lpes_cmd import generation_line


def demo_command(
    out: str = typer.Option("runs/demo", help="run folder (re-running resumes)"),
    model: str = ModelOption(),
    preset: str = typer.Option("quick", help="search preset: quick | standard | paper"),
    n: int = Count(10, help="held-out instances per depth"),
    seed: int = Seed,
    device: str = Device, dtype: str = Dtype, revision: Optional[str] = Revision,
):
    """Quick LPES search on the default model and task, then the held-out before/after table."""
    from posbias.models import load_model
    from posbias.search.config import SearchConfig
    from posbias.search.heldout import before_after
    from posbias.search.runner import run_search
    from posbias.utils.run_folder import out_path

    start = time.time()
    out_dir = out_path(out)
    load = load_options(device, dtype, revision)
    load.check(model)
    loaded = load_model(model, load)
    typer.echo(f"[1/2] LPES search ({preset}) on {model}, task kv (30 word keys) -> {out_dir / 'search'}")
    search = SearchConfig(out=str(out_dir / "search"), model=model, task="kv", preset=preset, seed=seed)
    result = run_search(search, resume=True, loaded=loaded, load=load,
                        log=lambda rec: typer.echo(generation_line(rec)))
    typer.echo(f"[2/2] held-out accuracy by depth, before / after -> {out_dir / 'heldout'}")
    before_after(model=model, task="kv", factors_path=result.factors_path, out=out_dir / "heldout", n=n,
                 seed=seed, loaded=loaded, load=load)
    typer.echo((out_dir / "heldout" / "comparison.md").read_text())
    typer.echo(f"factors: {result.factors_path}\nplots: {out_dir / 'search'}/*.png, "
               f"{out_dir / 'heldout'}/comparison.png")
    typer.echo(f"wall time: {time.time() - start:.0f} s")


def register(app: typer.Typer) -> None:
    app.command("demo")(friendly_errors(demo_command))
