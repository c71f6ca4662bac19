"""``posbias map``: where a model loses information, by gold depth x prompt length (x method)."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from posbias.cli.common import (
    Count,
    Device,
    Dtype,
    ExtraOpts,
    Haystack,
    ModelOption,
    Revision,
    Seed,
    friendly_errors,
    load_options,
    method_options_from_flags,
)
from posbias.utils.options import parse_key_values, parse_names, parse_numbers

DEPTHS_TEXT = ",".join(f"{i / 10:g}" for i in range(11))


def map_command(
    model: str = ModelOption(),
    out: str = typer.Option(..., help="run folder (re-running resumes; more methods, --n or --repeats add to it)"),
    task: Optional[str] = typer.Option(None, help="kv (default) | kv-uuid | niah | passkey; --data implies kv-uuid"),
    data: Optional[str] = typer.Option(None, "--data", help="a lost-in-the-middle kv-retrieval-*_keys.jsonl.gz file "
                                                            "(task kv-uuid)"),
    lengths: str = typer.Option("0.0625w,0.125w,0.25w,0.5w",
                                help="prompt lengths: tokens (2048) or fractions of the model's window (0.25w); "
                                     "the default counts the window as at most 8,192 tokens (512 .. 4,096)"),
    depths: str = typer.Option(DEPTHS_TEXT, help="gold depths in [0, 1], comma-separated"),
    methods: str = typer.Option("none", help="comma-separated methods or variants as in compare "
                                             "(none,pi@factor=0.9,...); the first is the reference"),
    factors: Optional[str] = typer.Option(None, help="factors file for lpes"),
    pi_factor: float = typer.Option(1.1, help="global factor for pi"),
    routers: Optional[str] = typer.Option(None, help="router weights for moice (posbias train-moice)"),
    settings: Optional[str] = typer.Option(None, help="best_settings.json from posbias tune"),
    n: int = Count(10, help="contexts per length (each asked at every depth): questions per cell"),
    repeats: int = Count(1, help="independent instance sets (seeds seed + 1000 r): the run-to-run noise floor"),
    seed: int = Seed,
    mode: str = typer.Option("teacher-forced", help="teacher-forced | both (greedy generation on the wrong "
                                                    "answers, classified)"),
    threshold: float = typer.Option(0.5, help="effective length: the first length whose middle-third accuracy "
                                              "falls below this"),
    batch_size: int = Count(8, help="questions per forward pass"),
    bootstrap: int = Count(1000, help="bootstrap resamples of the summary's intervals"),
    haystack: Optional[str] = Haystack,
    opt: Optional[list[str]] = ExtraOpts,
    device: str = Device, dtype: str = Dtype, revision: Optional[str] = Revision,
):
    """Score a depth x length grid (one prefill per shared context), summarise primacy, recency, middle
    dip and effective length with intervals (map.md, summary.json) and draw the heatmaps."""
    from posbias.evaluation.bias_map import run_map
    from posbias.evaluation.map_plots import heatmap_path

    cfg = map_config(model=model, out=out, task=task, data=data, lengths=lengths, depths=depths, methods=methods,
                     factors=factors, pi_factor=pi_factor, routers=routers, settings=settings, n=n, repeats=repeats,
                     seed=seed, mode=mode, threshold=threshold, batch_size=batch_size, bootstrap=bootstrap,
                     haystack=haystack, opt=opt)
    run_map(cfg, log=typer.echo, load=load_options(device, dtype, revision))
    folder = Path(out)
    typer.echo((folder / "map.md").read_text())
    typer.echo(f"heatmap: {heatmap_path(cfg)}")
    return cfg


def map_config(*, model, out, task, data, lengths, depths, methods, factors, pi_factor, routers, settings, n, repeats,
               seed, mode, threshold, batch_size, bootstrap, haystack, opt):
    """The :class:`~posbias.evaluation.bias_map.MapConfig` of the command-line flags."""
    from posbias.evaluation.bias_map import MapConfig

    names = parse_names(methods)
    task_opts = parse_key_values(opt, "opt")
    if haystack is not None:
        task_opts["haystack"] = haystack
    if data is not None:
        if task not in (None, "kv-uuid"):
            raise ValueError(f"--data is the lost-in-the-middle KV file of task kv-uuid, not of --task {task}")
        task, task_opts["path"] = "kv-uuid", data
    return MapConfig(model=model, out=out, task=task or "kv", lengths=parse_names(lengths),
                       depths=parse_numbers(depths, "depths"), methods=names,
                       method_options=method_options_from_flags(names, factors=factors, pi_factor=pi_factor,
                                                                routers=routers, settings=settings),
                       n=n, seed=seed, repeats=repeats, mode=mode, threshold=threshold, task_options=task_opts,
                       batch_size=batch_size, bootstrap=bootstrap)


def register(app: typer.Typer) -> None:
    app.command("map")(friendly_errors(map_command))
