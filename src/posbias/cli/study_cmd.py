"""``posbias study``: train one model per positional scheme and measure length extrapolation
(passkey / NIAH over lengths x depths, perplexity in both modes). See ``posbias.study.runner``."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from posbias.cli.common import (
    Count,
    Device,
    Seed,
    check_training_run,
    friendly_errors,
    parse_key_values,
    parse_numbers,
)
from posbias.cli.config_file import ConfigFileOption, require, settings_with_file
from posbias.utils.options import field_types, parse_depths, parse_names, parse_typed_options

STUDY_DERIVED = ("ppl_eval_tokens", "resume")  # recorded beside a study's settings, not read back


def study_command(
    ctx: typer.Context,
    out: Optional[str] = typer.Option(None, help="study folder (models, jsonl results, summary.md, plots/); "
                                                 "re-running resumes (trained models reused, finished cells "
                                                 "skipped); required unless --config names it"),
    preset: str = typer.Option("tiny", help="model size preset: tiny | small | 120m | 1b (a whole study in "
                                            "minutes: --config quick)"),
    schemes: str = typer.Option("rope,sinusoidal,nope,alibi,ggd,ggd+ssmax,rope+ssmax",
                                help="comma-separated <pe>[+ssmax], pe in rope|sinusoidal|nope|alibi|ggd|"
                                     "kerple-log|kerple-power|fire"),
    train_steps: Optional[int] = Count(None, help="training steps per scheme (default: the trainer's)"),
    train_context: int = Count(512, help="training context in tokens"),
    multipliers: str = typer.Option("1,2,4,8,16,32,64", help="evaluation lengths as multiples of the training context"),
    depths: str = typer.Option("0,0.25,0.5,0.75,1", help="needle depths in [0, 1]"),
    n: int = Count(5, help="instances per (length, depth) cell"),
    n_beyond: Optional[list[str]] = typer.Option(None, "--n-beyond", help="MULT=N: cells at lengths beyond MULT x the "
                                                 "training context hold N instances instead of --n (far lengths "
                                                 "cost minutes per instance on a CPU), e.g. 64=3"),
    needle_draw: str = typer.Option("shared", help="shared: the same n needles at every depth (paired across depths; "
                                    "n independent needles per length); per-depth: n fresh needles at every depth"),
    seed: int = Seed,
    corpus: Optional[str] = typer.Option(None,
                                         help="training text: .txt/.md, .jsonl with a 'text' field, or a folder of "
                                              "them (default: the trainer's)"),
    heldout: Optional[str] = typer.Option(None, help="held-out text for perplexity (default: the tail of --corpus, "
                                          "split off before training)"),
    passkey_rate: float = typer.Option(0.1, min=0.0, max=1.0,
                                       help="fraction of training blocks that are synthetic passkey documents "
                                                 "(the same for every scheme; 0 = plain text only)"),
    niah_rate: float = typer.Option(0.0, min=0.0, max=1.0, help="fraction of training blocks that are single-needle "
                                                                "RULER documents (beside the passkey ones)"),
    niah: bool = typer.Option(False, "--niah/--no-niah", help="also run RULER NIAH (string_match_all) on the grid"),
    niah_opt: Optional[list[str]] = typer.Option(None, "--niah-opt", help="NIAH option key=value, e.g. haystack=essay"),
    passkey_essay: bool = typer.Option(False, "--passkey-essay/--no-passkey-essay",
                                       help="also passkey with the Paul Graham essays as filler instead of "
                                            "grass/sky (retrieval that does not depend on the training filler)"),
    niah_essay: bool = typer.Option(False, "--niah-essay/--no-niah-essay",
                                    help="also NIAH with the essays as haystack (RULER single_2; --niah is single_1)"),
    passkey_heldout: bool = typer.Option(False, "--passkey-heldout/--no-passkey-heldout",
                                         help="also passkey filled with the sentences of the held-out text (the "
                                              "perplexity split or --heldout): natural text no model trained on"),
    dead_after: int = typer.Option(0, min=0, help="stop a scheme's passkey / NIAH grid after this many lengths in a "
                                   "row (shortest first) with no instance right; 0 = score every length"),
    modes: str = typer.Option("teacher-forced,generate", help="passkey scoring: teacher-forced, generate or both"),
    ppl_multipliers: str = typer.Option("1,2,4,8",
                                        help="perplexity contexts as multiples of the training context ('' = none)"),
    ppl_tokens: Optional[int] = Count(None, help="held-out tokens for perplexity (default 4x the longest context)"),
    batch_size: int = Count(4, help="max batch; capped so batch x length <= --token-budget"),
    token_budget: int = Count(8192, help="most tokens in one evaluation batch (batch x length)"),
    device: str = Device,
    train_workers: int = Count(1, help="schemes trained at once, each in its own process with an equal "
                                              "share of the CPU threads (CPU studies: one per core)"),
    tokenizer: Optional[str] = typer.Option(None,
                                            help="tokenizer of every model: a Hugging Face folder, or bpe:<N> = a "
                                            "byte-level BPE of N tokens trained once on the training split "
                                            "(default: SmolLM2's 49K vocabulary)"),
    train_opt: Optional[list[str]] = typer.Option(None, "--train-opt",
                                                  help="extra training option key=value (same for all schemes)"),
    model_opt: Optional[list[str]] = typer.Option(None, "--model-opt", help="model setting key=value for every scheme "
                                                  "(a BamConfig field, e.g. rope_theta=10000)"),
    config: Optional[str] = ConfigFileOption("study"),
):
    """Train each positional scheme on one budget and evaluate it from 1x to Kx its training length."""
    from posbias.bam import BamConfig
    from posbias.study.runner import (
        StudyConfig,
        discard_unfinished,
        run_study,
        study_check_keys,
        study_settings,
        upgrade_settings,
    )
    from posbias.training.config import TrainConfig

    flags = dict(
        out=out, preset=preset, schemes=schemes, train_steps=train_steps, train_context=train_context,
        multipliers=parse_numbers(multipliers, "multipliers"), depths=parse_depths(depths), n=n,
        n_beyond=parse_key_values(n_beyond, "n-beyond"),
        needle_draw=needle_draw,
        seed=seed, corpus=corpus, heldout=heldout, passkey_rate=passkey_rate, niah_rate=niah_rate, niah=niah,
                 niah_options=parse_key_values(niah_opt, "niah-opt"),
        passkey_essay=passkey_essay, niah_essay=niah_essay, passkey_heldout=passkey_heldout, dead_after=dead_after,
        modes=parse_names(modes),
        ppl_multipliers=parse_numbers(ppl_multipliers, "ppl-multipliers"), ppl_tokens=ppl_tokens,
        batch_size=batch_size, token_budget=token_budget, device=device,
        train_options=parse_typed_options(train_opt, field_types(TrainConfig), "train-opt", "training option"),
        model_options=parse_typed_options(model_opt, field_types(BamConfig), "model-opt", "model option"),
        tokenizer=tokenizer, train_workers=train_workers,
    )
    from posbias.utils.run_folder import out_path

    flags = settings_with_file(ctx, config, "study", flags, field_types(StudyConfig), ignore=STUDY_DERIVED,
                               fields_of={"train_opt": "train_options", "model_opt": "model_options",
                                          "niah_opt": "niah_options"})
    require(flags, "out", "--out")
    cfg = StudyConfig(**flags)
    settings = study_settings(cfg)
    discard_unfinished(out_path(cfg.out), settings)  # a study without results does not lock its folder
    cfg.resume = check_training_run(cfg, "study", settings, study_check_keys(out_path(cfg.out)),
                                    upgrade=upgrade_settings)
    result = run_study(cfg)
    typer.echo(summary_head(Path(result["summary"])))


def summary_head(path: Path, lines: int = 30) -> str:
    """The start of a study's ``summary.md`` (its first tables) and where the whole of it is."""
    text = path.read_text(encoding="utf-8").splitlines()
    more = f"\n... ({len(text) - lines} more lines)" if len(text) > lines else ""
    return "\n".join(text[:lines]) + more + f"\nsummary: {path}"


def study_seeds_command(
    folders: list[str] = typer.Argument(..., help="two or more study folders (e.g. one per training seed)"),
    out: str = typer.Option(..., help="markdown file to write; one accuracy-vs-length PNG per view beside it, "
                            "and <stem>_probes.png (1x probes against the training step) when the trainers probed"),
    mode: str = typer.Option("tf", help="passkey scoring to tabulate: tf (teacher-forced) or gen (generation)"),
    schemes: str = typer.Option("", help="comma-separated schemes to compare (default: every scheme of the folders)"),
):
    """Study folders side by side: every view in one overview table (each folder's accuracy per cell), then
    one row per scheme and seed for every grid view, with intervals."""
    from posbias.study.seeds import compare_studies

    if mode not in ("tf", "gen"):
        raise ValueError(f"--mode must be tf or gen, not {mode!r}")
    typer.echo(compare_studies(folders, out, mode=mode, schemes=parse_names(schemes) if schemes else ()))


def register(app: typer.Typer) -> None:
    app.command("study")(friendly_errors(study_command))
    app.command("study-seeds")(friendly_errors(study_seeds_command))
