"""``posbias map``: where a model loses information, by gold depth x prompt length (x method)."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from posbias.cli.common import (
    DEPTHS_HELP,
    AttentionOption,
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
from posbias.cli.config_file import ConfigFileOption, given_parameters, require, settings_with_file
from posbias.utils.options import field_types, parse_depths, parse_key_values, parse_names

DEPTHS_TEXT = ",".join(f"{i / 10:g}" for i in range(11))


def map_command(
    ctx: typer.Context,
    model: str = ModelOption(),
    out: Optional[str] = typer.Option(None, help="run folder (re-running resumes; more methods, --n or --repeats add "
                                                 "to it); required unless --config names it"),
    task: Optional[str] = typer.Option(None, help="kv (default) | kv-uuid | mdqa | niah | passkey; --data alone "
                                                  "implies kv-uuid"),
    data: Optional[str] = typer.Option(None, "--data", help="the task's data: a lost-in-the-middle "
                                                            "kv-retrieval-*_keys.jsonl.gz file (kv-uuid), or for "
                                                            "--task mdqa an nq-open-*.jsonl.gz file or hotpotqa"),
    lengths: str = typer.Option("0.0625w,0.125w,0.25w,0.5w",
                                help="prompt lengths: tokens (2048) or fractions of the model's window (0.25w); "
                                     "the default counts the window as at most 8,192 tokens (512 .. 4,096)"),
    depths: str = typer.Option(DEPTHS_TEXT, help=DEPTHS_HELP),
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
    attention: bool = AttentionOption,
    device: str = Device, dtype: str = Dtype, revision: Optional[str] = Revision,
    config: Optional[str] = ConfigFileOption(),
):
    """Score a depth x length grid (one prefill per shared context), summarise primacy, recency, middle
    dip and effective length with intervals (map.md, summary.json) and draw the heatmaps."""
    from posbias.evaluation.bias_map import MapConfig, run_map
    from posbias.evaluation.map_plots import heatmap_path

    load = load_options(device, dtype, revision)
    task, task_opts = map_task(task, data, haystack, opt)
    flags = dict(model=model, out=out, task=task, lengths=parse_names(lengths), depths=parse_depths(depths),
                 methods=parse_names(methods), n=n, seed=seed, repeats=repeats, mode=mode, threshold=threshold,
                 task_options=task_opts, batch_size=batch_size, bootstrap=bootstrap, attention=attention)
    values = settings_with_file(ctx, config, "map", flags, field_types(MapConfig), fields_of={"data": "task"})
    require(values, "out", "--out")
    pi_factor_given = config is None or "pi_factor" in (given_parameters(ctx) or ())
    values["method_options"] = method_options_from_flags(  # the flags given over the file's options
        values["methods"], factors=factors, pi_factor=pi_factor if pi_factor_given else None, routers=routers,
        settings=settings, recorded=values.get("method_options"))
    cfg = MapConfig(**values)
    run_map(cfg, log=typer.echo, load=load)
    typer.echo((Path(cfg.out).expanduser() / "map.md").read_text())
    typer.echo(f"heatmap: {heatmap_path(cfg)}")
    return cfg


def map_task(task: str | None, data: str | None, haystack: str | None, opt: list[str] | None) -> tuple[str, dict]:
    """The task of ``--task`` / ``--data`` (a lost-in-the-middle KV file: kv-uuid; with ``--task mdqa`` its
    documents; default kv) and its options (``--haystack``, ``--opt key=value``)."""
    task_opts = parse_key_values(opt, "opt")
    if haystack is not None:
        task_opts["haystack"] = haystack
    if data is not None:
        if task not in (None, "kv-uuid", "mdqa"):
            raise ValueError(f"--data is the data file of task kv-uuid or mdqa, not of --task {task}")
        task, task_opts["path"] = task or "kv-uuid", data
    return task or "kv", task_opts


def register(app: typer.Typer) -> None:
    app.command("map")(friendly_errors(map_command))
