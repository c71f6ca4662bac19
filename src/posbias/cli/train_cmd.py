"""``posbias train``: pre-train a BAM decoder (positional scheme x normaliser) from scratch.

Runs under ``torchrun --nproc_per_node N`` for data parallelism (one process per GPU / CPU rank).
"""
from __future__ import annotations

from typing import Optional

import typer

from posbias.cli.common import Count, Device, Seed, check_training_run, friendly_errors
from posbias.cli.config_file import ConfigFileOption, require, settings_with_file
from posbias.utils.options import field_types, parse_typed_options


def train_command(
    ctx: typer.Context,
    out: Optional[str] = typer.Option(None, help="run folder (config.json, metrics.jsonl, checkpoint.pt, final/); "
                                                 "re-running resumes from its checkpoint (required unless "
                                                 "--config names it)"),
    pe: str = typer.Option("ggd", help="positional scheme: rope, sinusoidal, nope, alibi, ggd, kerple-log, "
                                       "kerple-power, fire"),
    ssmax: bool = typer.Option(False, "--ssmax/--softmax", help="Scalable-Softmax instead of softmax"),
    preset: str = typer.Option("tiny", help="model size: tiny, small, 120m, 1b"),
    steps: int = Count(1000, help="optimizer steps"),
    context: int = Count(512, help="training context length in tokens"),
    batch_size: int = Count(8, help="sequences per step and process"),
    grad_accum: int = Count(1, help="gradient accumulation micro-steps"),
    lr: float = typer.Option(1e-3, help="peak learning rate"),
    prior_lr: Optional[float] = typer.Option(None, help="learning rate of the learnable priors (GGD, KERPLE, FIRE) / "
                                             "SSMax scales (default --lr)"),
    warmup: int = Count(100, minimum=0, help="linear warmup steps"),
    min_lr_ratio: float = typer.Option(0.1, help="the schedule decays to this fraction of --lr"),
    schedule: str = typer.Option("cosine", help="cosine (to --min-lr-ratio at --steps), constant (after warmup; "
                                 "the same run whatever the --steps cap) or wsd (constant, then linear decay over "
                                 "the last --decay-fraction of --steps)"),
    decay_fraction: float = typer.Option(0.2, help="wsd: fraction of --steps that decays"),
    weight_decay: float = typer.Option(0.1, help="weight decay on 2-D weights"),
    grad_clip: float = typer.Option(1.0, help="gradient norm clip"),
    optimizer: str = typer.Option("adamw", help="adamw or radam"),
    seed: int = Seed,
    corpus: Optional[list[str]] = typer.Option(None, help="text files / folders (.txt, .md, .jsonl with 'text'); "
                                                           "repeatable; default: the Paul Graham essays"),
    tokenizer: Optional[str] = typer.Option(None,
                                            help="HF tokenizer folder or name, or bpe:<N> = a byte-level BPE of N "
                                            "tokens trained on --corpus into <out>/tokenizer (default SmolLM2's)"),
    passkey_rate: float = typer.Option(0.0, min=0.0, max=1.0,
                                       help="fraction of blocks replaced by synthetic passkey documents"),
    niah_rate: float = typer.Option(0.0, min=0.0, max=1.0,
                                    help="fraction of blocks replaced by single-needle RULER documents"),
    passkey_haystack: str = typer.Option("noise", help="filler of the passkey documents: noise (grass/sky), "
                                         "corpus (runs of training sentences) or mixed (either, half each)"),
    niah_haystack: str = typer.Option("noise", help="filler of the NIAH documents: noise, corpus or mixed"),
    checkpoint_every: int = Count(200, help="checkpoint every N steps"),
    probe_every: int = Count(0, minimum=0, help="every N steps log passkey retrieval at the training length to "
                                                "metrics.jsonl (passkey_em, passkey_logprob; 0 = never)"),
    probe_n: int = Count(8, help="documents per probe task"),
    probe_tasks: str = typer.Option("passkey", help="what the probe scores: passkey, niah or passkey,niah "
                                    "(--probe-target then needs every one)"),
    probe_target: float = typer.Option(0.0, min=0.0, max=1.0,
                                       help="stop once the probe's exact match holds this for --probe-patience "
                                            "probes in a row (--steps is then the cap; 0 = train all steps)"),
    probe_patience: int = Count(3, help="consecutive probes at --probe-target that end training"),
    final_step: Optional[int] = typer.Option(None, help="end at this step and keep its model as the final one, the "
                                             "schedule still spanning --steps (runs compared at equal tokens; "
                                             "a later value on a rerun continues the run)"),
    log_every: int = Count(10, help="log metrics every N steps"),
    precision: str = typer.Option("auto", help="auto (bf16 on CUDA), bf16 or fp32"),
    device: str = Device,
    model_opt: Optional[list[str]] = typer.Option(None, "--model-opt",
                                                  help="BamConfig override key=value (repeatable), e.g. "
                                                       "ggd_init=alibi, num_hidden_layers=2"),
    config: Optional[str] = ConfigFileOption(),
):
    """Pre-train a BAM decoder; the final model is saved with save_pretrained under OUT/final."""
    from posbias.bam import BamConfig
    from posbias.training import TrainConfig, train
    from posbias.training.trainer import CHECKPOINT, resume_check_keys
    from posbias.utils.run_folder import out_path

    flags = dict(
        out=out, pe=pe, ssmax=ssmax, preset=preset, model_overrides=parse_typed_options(
            model_opt, field_types(BamConfig), "model-opt", "model option"),
        steps=steps, context=context, batch_size=batch_size, grad_accum=grad_accum, lr=lr, prior_lr=prior_lr,
        warmup_steps=warmup, min_lr_ratio=min_lr_ratio, schedule=schedule, decay_fraction=decay_fraction,
        weight_decay=weight_decay, grad_clip=grad_clip,
        optimizer=optimizer, seed=seed, corpus=list(corpus) if corpus else None, tokenizer=tokenizer,
        passkey_rate=passkey_rate, niah_rate=niah_rate, passkey_haystack=passkey_haystack, niah_haystack=niah_haystack,
        checkpoint_every=checkpoint_every, probe_every=probe_every,
        probe_n=probe_n, probe_tasks=probe_tasks, probe_target=probe_target, probe_patience=probe_patience,
        final_step=final_step, log_every=log_every,
        precision=precision, device=device)
    settings = settings_with_file(ctx, config, "train", flags, field_types(TrainConfig), ignore=("resume",),
                                  fields_of={"warmup": "warmup_steps", "model_opt": "model_overrides"})
    require(settings, "out", "--out")
    cfg = TrainConfig(**settings)
    out = out_path(cfg.out)
    check_training_run(cfg, "train", cfg.to_json(), resume_check_keys(out))
    cfg.resume = (out / CHECKPOINT).exists()  # re-running resumes from the checkpoint
    path = train(cfg)
    typer.echo(str(path))


def register(app: typer.Typer) -> None:
    app.command("train")(friendly_errors(train_command))
