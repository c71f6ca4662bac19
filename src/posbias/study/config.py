"""Settings of a length-extrapolation study (:class:`StudyConfig`) and the names of its files."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

from posbias.evaluation.long_context import MODES, check_needle_draw
from posbias.evaluation.modes import canonical_mode
from posbias.study.grid import (
    DEFAULT_DEPTHS,
    DEFAULT_MULTIPLIERS,
    DEFAULT_PPL_MULTIPLIERS,
    DEFAULT_SCHEMES,
    grid_lengths,
    parse_schemes,
)
from posbias.training.config import typed_train_options
from posbias.utils.io import read_json
from posbias.utils.options import check_int

MODELS_FILE = "models.json"
METRICS_FILE = "metrics.jsonl"
SUMMARY_FILE = "summary.md"
# What the trained models depend on: a change discards a study's unfinished training (see
# posbias.study.runner.discard_unfinished), and is refused once the study holds a result.
TRAINING_KEYS = ("preset", "train_steps", "train_context", "seed", "corpus", "heldout", "passkey_rate", "niah_rate",
                 "train_options", "model_options", "tokenizer")
# What only the evaluation depends on: checked on the resume of a study that holds results, free before.
EVALUATION_KEYS = ("depths", "needle_draw",
                   "ppl_eval_tokens")  # not ppl_multipliers: a resume may add perplexity contexts (same eval tokens)
CHECK_KEYS = TRAINING_KEYS + EVALUATION_KEYS
# Training options that change how a run logs, checkpoints or probes, never the weights it trains.
TRAIN_LOGGING_OPTIONS = ("log_every", "checkpoint_every", "probe_every", "probe_n", "probe_tasks", "progress",
                         "stop_after", "device")
DATA_DIR = "data"
HELDOUT_CHARS_PER_TOKEN = 6  # generous: English BPE averages ~4-5 characters per token
MAX_HELDOUT_FRACTION = 0.3


def training_settings(config: dict) -> dict:
    """The part of a study ``config`` dict its trained models depend on (:data:`TRAINING_KEYS`, the
    training options less :data:`TRAIN_LOGGING_OPTIONS`; ``ppl_eval_tokens`` too when the held-out
    text is the corpus's tail, cut off before training). Keys ``config`` lacks stay absent."""
    out = {k: config[k] for k in TRAINING_KEYS if k in config}
    if isinstance(out.get("train_options"), dict):
        out["train_options"] = {k: v for k, v in out["train_options"].items() if k not in TRAIN_LOGGING_OPTIONS}
    if not config.get("heldout") and "ppl_eval_tokens" in config:
        out["ppl_eval_tokens"] = config["ppl_eval_tokens"]
    return out


def read_models_file(out: str | Path) -> dict[str, str]:
    """A study folder's ``models.json`` (``{scheme: model folder}``; empty when there is none); a damaged
    one is a ``ValueError`` naming it."""

    path = Path(out) / MODELS_FILE
    if not path.exists():
        return {}
    models = read_json(path)
    if not isinstance(models, dict) or not all(isinstance(v, str) for v in models.values()):
        raise ValueError(f"{path}: expected an object mapping each scheme to its model folder; fix or delete it "
                         "(the trained models stay in models/ and are found again)")
    return models


def upgrade_settings(old: dict) -> dict:
    """A study's recorded settings in today's form (:func:`posbias.training.config.typed_train_options`:
    a ``probe_tasks`` training option recorded as a comma-separated string is a list now)."""
    if not isinstance(old.get("train_options"), dict):
        return old
    return {**old, "train_options": typed_train_options(old["train_options"])}


def split_files(out: str | Path) -> tuple[Path, Path]:
    """``(training part, held-out part)`` of a study folder's corpus split (see
    :func:`posbias.study.data.prepare_data`)."""
    data = Path(out) / DATA_DIR
    return data / "train.jsonl", data / "heldout.jsonl"


def has_split(out: str | Path) -> bool:
    """Whether an earlier invocation left a corpus split in the study folder (reused on resume)."""
    return all(p.exists() for p in split_files(out))


def ppl_eval_tokens(config: dict) -> int | None:
    """The held-out tokens a study's perplexity is measured on (a study ``config`` dict): ``ppl_tokens``,
    else 4x its longest perplexity context; None without perplexity. Contexts may change between
    invocations of one study; these tokens may not (every perplexity row is on the same text). A
    recorded ``ppl_eval_tokens`` wins (an invocation without perplexity records its folder's)."""
    if config.get("ppl_eval_tokens") is not None:
        return int(config["ppl_eval_tokens"])
    multipliers = config.get("ppl_multipliers") or []
    if not multipliers:
        return None
    return int(config.get("ppl_tokens") or 4 * max(grid_lengths(int(config["train_context"]), multipliers)))


def check_n_beyond(n_beyond: dict) -> dict[float, int]:
    """``{"64": 3}`` (``--n-beyond 64=3``) -> ``{64.0: 3}``: a multiplier > 0 and a count >= 1 each,
    or a ``ValueError`` naming the pair."""
    out = {}
    for key, value in dict(n_beyond).items():
        try:
            mult = float(key)
        except ValueError:
            mult = float("nan")
        if not mult > 0 or isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"--n-beyond {key}={value}: give MULTIPLIER=N with a multiplier > 0 and N >= 1 "
                             f"instances per cell (e.g. 64=3)")
        out[mult] = value
    return out


def needle_draw_of(config: dict) -> str:
    """A study ``config`` dict's needle draw; folders written before the setting was recorded drew
    ``shared`` (the same needles at every depth)."""
    return config.get("needle_draw", "shared")


def study_modes(modes) -> list[str]:
    """The grid's scoring modes: ``teacher-forced`` / ``generate`` in any accepted spelling, ``both``
    for the two; anything else is refused here, before any scheme is trained."""

    out: list[str] = []
    for m in modes:
        for mode in (MODES if str(m).strip().lower() == "both" else [canonical_mode(m)]):
            if mode not in MODES:
                raise ValueError(f"unknown mode {m!r}; choose teacher-forced, generate or both")
            if mode not in out:
                out.append(mode)
    if not out:
        raise ValueError("modes is empty: choose teacher-forced, generate or both")
    return out


@dataclass
class StudyConfig:
    """Settings of one study (see the module docstring)."""

    out: str
    preset: str = "tiny"
    schemes: list[str] = field(default_factory=lambda: list(DEFAULT_SCHEMES))
    train_steps: int | None = None
    train_context: int = 512
    multipliers: list[float] = field(default_factory=lambda: list(DEFAULT_MULTIPLIERS))
    depths: list[float] = field(default_factory=lambda: list(DEFAULT_DEPTHS))
    n: int = 5
    # {multiplier: n}: cells at lengths beyond multiplier x train_context hold this many instances instead
    # (the far lengths cost minutes per instance on a CPU); the largest multiplier passed decides
    n_beyond: dict = field(default_factory=dict)
    needle_draw: str = "shared"  # "per-depth": n fresh needles at every depth (n x depths independent per length)
    seed: int = 0
    corpus: str | None = None
    heldout: str | None = None
    passkey_rate: float | None = 0.1
    niah_rate: float = 0.0  # single-needle RULER documents in the training mix (beside passkey ones)
    niah: bool = False
    niah_options: dict = field(default_factory=dict)
    passkey_essay: bool = False  # also passkey in the essay haystack (a filler never trained on)
    niah_essay: bool = False  # also NIAH in the essay haystack (RULER single_2)
    passkey_heldout: bool = False  # also passkey filled with the held-out text's sentences (never trained on)
    dead_after: int = 0  # a view stops for a scheme after this many lengths in a row with 0 correct (0 = never)
    modes: list[str] = field(default_factory=lambda: ["teacher-forced", "generate"])
    ppl_multipliers: list[float] = field(default_factory=lambda: list(DEFAULT_PPL_MULTIPLIERS))
    ppl_tokens: int | None = None
    batch_size: int = 4
    token_budget: int = 8192
    device: str = "auto"
    train_options: dict = field(default_factory=dict)
    model_options: dict = field(default_factory=dict)  # BamConfig fields for every scheme, e.g. {"rope_theta": 1e4}
    train_workers: int = 1  # schemes trained at once, in separate processes
    tokenizer: str | None = None  # None = the trainer's (SmolLM2's); "bpe:<N>" = one BPE trained on the training split
    resume: bool = False

    def __post_init__(self):
        self.schemes = parse_schemes(self.schemes)
        self.train_options = typed_train_options(self.train_options)
        self.modes = study_modes(self.modes)
        self.multipliers = [float(m) for m in self.multipliers]
        self.depths = [float(d) for d in self.depths]
        self.ppl_multipliers = [float(m) for m in self.ppl_multipliers]
        if self.n < 1:
            raise ValueError(f"n must be >= 1, got {self.n}")
        self.n_beyond = check_n_beyond(self.n_beyond)
        check_needle_draw(self.needle_draw)
        self.dead_after = check_int("dead_after", self.dead_after, minimum=0)
        if self.train_workers < 1:
            raise ValueError(f"train_workers must be >= 1, got {self.train_workers}")
        if self.train_steps is not None and self.train_steps < 1:
            raise ValueError(f"train_steps must be >= 1, got {self.train_steps}")
        grid_lengths(self.train_context, self.multipliers)  # validates
        if self.passkey_heldout and not (self.heldout or self.ppl_multipliers or has_split(self.out)):
            raise ValueError("passkey_heldout fills the passkey with the held-out text, which a study sets aside "
                             "for perplexity: give --heldout or keep --ppl-multipliers")

    def n_at(self, length: int) -> int:
        """Instances per (length, depth) cell at ``length`` tokens: ``n``, or ``n_beyond``'s count of the
        largest multiplier that ``length`` exceeds."""
        passed = [m for m in self.n_beyond if length > m * self.train_context]
        return self.n_beyond[max(passed)] if passed else self.n

    @property
    def lengths(self) -> list[int]:
        return grid_lengths(self.train_context, self.multipliers)

    @property
    def ppl_contexts(self) -> list[int]:
        return grid_lengths(self.train_context, self.ppl_multipliers) if self.ppl_multipliers else []

    @property
    def ppl_eval_tokens(self) -> int | None:
        return ppl_eval_tokens({"ppl_multipliers": self.ppl_multipliers, "ppl_tokens": self.ppl_tokens,
                                "train_context": self.train_context})

    def to_dict(self) -> dict:
        """The settings, plus the derived ``ppl_eval_tokens`` (checked on resume instead of the contexts)."""
        return {**dataclasses.asdict(self), "ppl_eval_tokens": self.ppl_eval_tokens}
