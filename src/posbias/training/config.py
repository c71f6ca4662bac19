"""Settings of one BAM training run: :class:`TrainConfig`, its checks, and the model config it builds."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from posbias.bam import BamConfig
from posbias.positional import get_scheme
from posbias.utils.options import refuse_unknown

from .data import check_passkey_haystack
from .probe import PROBE_TASKS

OPTIMIZERS = ("adamw", "radam")
SCHEDULES = ("cosine", "constant", "wsd")
PRECISIONS = ("auto", "bf16", "fp32")
# settings that must match when resuming a run folder
RESUME_KEYS = ("pe", "ssmax", "preset", "model_overrides", "context", "batch_size", "grad_accum", "lr", "prior_lr",
               "min_lr_ratio", "warmup_steps", "schedule", "decay_fraction", "weight_decay", "betas", "grad_clip",
               "optimizer", "seed", "corpus", "tokenizer", "passkey_rate", "niah_rate", "passkey_haystack",
               "niah_haystack", "steps")


@dataclass
class TrainConfig:
    """Settings of one training run (all JSON-serialisable; stored in ``out/config.json``)."""

    out: str = "runs/bam"
    pe: str = "ggd"
    ssmax: bool = False
    preset: str = "tiny"
    model_overrides: dict = field(default_factory=dict)  # BamConfig fields, e.g. {"ggd_init": "alibi"}
    steps: int = 1000
    context: int = 512
    batch_size: int = 8  # sequences per optimizer step and process (x grad_accum)
    grad_accum: int = 1
    lr: float = 1e-3
    prior_lr: float | None = None  # own lr for priors / SSMax scales (default: lr)
    min_lr_ratio: float = 0.1
    warmup_steps: int = 100
    schedule: str = "cosine"  # cosine (to min_lr_ratio at steps) | constant | wsd (see lr_lambda)
    decay_fraction: float = 0.2  # wsd: the last fraction of steps that decays to min_lr_ratio
    weight_decay: float = 0.1
    betas: tuple[float, float] = (0.9, 0.95)
    grad_clip: float = 1.0
    optimizer: str = "adamw"
    seed: int = 0
    corpus: list[str] | None = None  # files / folders / "paul-graham" (default)
    tokenizer: str | None = None  # HF folder or name, "bpe:<N>" (trained on the corpus); None = SmolLM2's
    passkey_rate: float = 0.0
    niah_rate: float = 0.0  # fraction of blocks that are single-needle RULER documents (noise haystack)
    passkey_haystack: str = "noise"  # passkey filler: noise (the evaluation's) | corpus (training sentences) | mixed
    niah_haystack: str = "noise"  # filler of the single-needle RULER documents, the same choices
    checkpoint_every: int = 200
    probe_every: int = 0  # every N steps log passkey retrieval at the training length (0 = never)
    probe_n: int = 8  # documents per probe task
    # what the probe scores: passkey, niah or both; the target needs all ("passkey,niah" is read as a list too)
    probe_tasks: tuple[str, ...] = ("passkey",)
    probe_target: float = 0.0  # stop once the probe's exact match >= this for probe_patience probes in a row (0 = off)
    probe_patience: int = 3  # consecutive probes at probe_target that end training (steps is then the cap)
    log_every: int = 10
    resume: bool = False
    precision: str = "auto"  # auto = bf16 autocast on CUDA with bf16 support, else fp32
    device: str = "auto"
    stop_after: int | None = None  # end this invocation after that global step (checkpointed); for preemption tests
    # end the run at this step and keep that model as the final one, the schedule still spanning ``steps``: a run
    # truncated on purpose (e.g. two data mixes compared at equal tokens); a resume with a later one continues it
    final_step: int | None = None
    progress: bool = True

    def __post_init__(self) -> None:
        """Values as a JSON file or an older run folder gives them: lists for tuples, and ``probe_tasks``
        as the comma-separated text that run folders before the typed options recorded."""
        self.betas = tuple(self.betas)
        self.probe_tasks = split_names(self.probe_tasks)

    def validate(self) -> None:

        get_scheme(self.pe)
        if self.probe_every < 0 or self.probe_n < 1:
            raise ValueError("probe_every must be >= 0 and probe_n >= 1")
        if not 0.0 <= self.probe_target <= 1.0 or self.probe_patience < 1:
            raise ValueError("probe_target must be in [0, 1] and probe_patience >= 1")
        if self.probe_target > 0 and self.probe_every <= 0:
            raise ValueError("probe_target needs probe_every > 0 (the probe it waits for)")
        tasks = self.probe_task_names
        if not tasks or any(t not in PROBE_TASKS for t in tasks):
            raise ValueError(f"probe_tasks must name some of {', '.join(PROBE_TASKS)}, got {self.probe_tasks!r}")
        for name in ("steps", "context", "batch_size", "grad_accum", "checkpoint_every", "log_every"):
            if int(getattr(self, name)) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.lr <= 0 or (self.prior_lr is not None and self.prior_lr < 0):
            raise ValueError("learning rates must be positive")
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"unknown optimizer {self.optimizer!r}; known: {', '.join(OPTIMIZERS)}")
        if self.precision not in PRECISIONS:
            raise ValueError(f"unknown precision {self.precision!r}; known: {', '.join(PRECISIONS)}")
        if not 0.0 <= self.passkey_rate <= 1.0:
            raise ValueError(f"passkey_rate must be in [0, 1], got {self.passkey_rate}")
        if not 0.0 <= self.niah_rate <= 1.0 - self.passkey_rate:
            raise ValueError(f"niah_rate must be in [0, 1 - passkey_rate], got {self.niah_rate}")
        check_passkey_haystack(self.passkey_haystack)
        check_passkey_haystack(self.niah_haystack, "niah_haystack")
        if self.final_step is not None and not 1 <= int(self.final_step) <= int(self.steps):
            raise ValueError(f"final_step must lie in [1, steps = {self.steps}], got {self.final_step}")
        if self.warmup_steps < 0 or not 0.0 <= self.min_lr_ratio <= 1.0:
            raise ValueError("warmup_steps must be >= 0 and min_lr_ratio in [0, 1]")
        if self.schedule not in SCHEDULES:
            raise ValueError(f"unknown schedule {self.schedule!r}; known: {', '.join(SCHEDULES)}")
        if not 0.0 < self.decay_fraction <= 1.0:
            raise ValueError(f"decay_fraction must be in (0, 1], got {self.decay_fraction}")
        check_model_overrides(self.model_overrides)

    @property
    def probe_task_names(self) -> tuple[str, ...]:
        return self.probe_tasks

    def to_json(self) -> dict:
        d = dataclasses.asdict(self)
        d["betas"] = list(self.betas)
        d["probe_tasks"] = list(self.probe_tasks)
        return d


def typed_train_options(options: dict) -> dict:
    """Training options (:class:`TrainConfig` fields) as a run records them today: ``probe_tasks`` a list
    (run folders before the typed options, and Python callers, may give ``"passkey,niah"``)."""
    out = dict(options)
    if "probe_tasks" in out:
        out["probe_tasks"] = list(split_names(out["probe_tasks"]))
    return out


def split_names(value) -> tuple[str, ...]:
    """``"passkey, niah"`` or ``["passkey", "niah"]`` -> ``("passkey", "niah")`` (empty items dropped)."""
    items = value.split(",") if isinstance(value, str) else list(value or ())
    return tuple(str(t).strip() for t in items if str(t).strip())


def run_label(cfg: TrainConfig) -> str:
    """What the progress bar calls the run: ``ggd``, ``ggd+ssmax``, ``ggd+ssmax-content``."""
    if not cfg.ssmax:
        return cfg.pe
    return f"{cfg.pe}+ssmax" + ("-content" if cfg.model_overrides.get("ssmax_scope") == "content" else "")


def check_model_overrides(overrides: dict) -> None:
    """Every key must be a :class:`posbias.bam.BamConfig` argument (a Hugging Face config would keep a
    misspelt one as an unused attribute, and the run would train the default silently)."""

    refuse_unknown(overrides, BamConfig.defaults(), "model option")


def build_bam_config(cfg: TrainConfig, tokenizer):

    n_tok = len(tokenizer)
    overrides = dict(cfg.model_overrides)
    vocab = overrides.pop("vocab_size", 64 * ((n_tok + 63) // 64))
    if vocab < n_tok:
        raise ValueError(f"the tokenizer has {n_tok} tokens but the model vocabulary is {vocab}: "
                         f"use a larger vocab_size or another tokenizer")
    return BamConfig.from_preset(
        cfg.preset, pe=cfg.pe, normaliser="ssmax" if cfg.ssmax else "softmax", vocab_size=vocab,
        max_position_embeddings=cfg.context, pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, **overrides)
