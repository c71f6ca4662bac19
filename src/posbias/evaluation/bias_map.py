"""The position-bias map: accuracy over gold depth x prompt length x method, in one resumable run folder.

One run (``posbias map``) scores, for every method, every repeat and every prompt length, ``n``
contexts of the task at every gold depth. Where the task has a shared-context form (word-key KV, and
multi-needle NIAH) a context is prefilled once and all its depths are asked from that prefill
(:func:`posbias.evaluation.teacher_forced.score_instances`); other tasks (passkey, the
lost-in-the-middle UUID file) score one prompt per question.

Lengths are given in tokens (``2048``) or as fractions of the model's window (``0.25w``: a quarter
of ``max_position_embeddings``). A KV context is fitted to a length by its number of keys, a
multi-document QA prompt by its number of documents (:func:`fit_items`); passkey and NIAH fit their
haystack themselves. ``attention``: every record also says where the last prompt position's attention
went (:mod:`posbias.evaluation.attention_probe`), summarised per method and length.

The run folder holds ``config.json``, ``results.jsonl`` (one line per scored question, appended as
soon as its context is scored; the key ``(method, repeat, length, id)`` makes a killed run resume
where it stopped), ``metrics.jsonl`` (time, prefills and questions per method, repeat and length),
``summary.json`` / ``map.md`` (:mod:`posbias.evaluation.map_summary`) and the figures
(:mod:`posbias.evaluation.map_plots`).
"""
from __future__ import annotations

import contextlib
import re
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Sequence

from posbias.evaluation.attention_probe import AttentionProbe
from posbias.evaluation.batching import encode, model_max_positions, prompt_text
from posbias.evaluation.compare import check_method_list
from posbias.evaluation.map_failures import classify_group
from posbias.evaluation.map_plots import plot_map
from posbias.evaluation.map_summary import write_summary
from posbias.evaluation.modes import MAP_MODES
from posbias.evaluation.scoring import prompt_dependent
from posbias.evaluation.session import applied_method
from posbias.evaluation.teacher_forced import question_groups, score_instances
from posbias.methods.registry import check_method, variant_options
from posbias.models import load_model
from posbias.models.adapter import adapter_record, eval_settings
from posbias.models.options import load_settings
from posbias.tasks import check_request, make_instances
from posbias.tasks.base import check_int
from posbias.tasks.fitting import fit_units
from posbias.tasks.hotpotqa import is_hotpotqa
from posbias.tasks.kv import WORDS, load_kv_file
from posbias.tasks.registry import check_records
from posbias.utils.io import append_jsonl, repair_jsonl
from posbias.utils.run_folder import announce_resume, open_run

MAP_TASKS = ("kv", "kv-uuid", "mdqa", "niah", "passkey")
DEFAULT_DEPTHS = tuple(round(i / 10, 1) for i in range(11))
# Default lengths: these fractions of the model's window, the window counted as at most DEFAULT_WINDOW_CAP
# tokens (512 .. 4,096 tokens for an 8K or longer window).
DEFAULT_LENGTHS = ("0.0625w", "0.125w", "0.25w", "0.5w")
DEFAULT_WINDOW_CAP = 8192
# Settings that must match when a map folder is resumed; methods, n and repeats may grow.
MAP_RESUME_KEYS = ("model", "task", "lengths", "depths", "seed", "mode", "task_options", "method_options",
                   "max_new_tokens", "attention")
REPEAT_SEED_STRIDE = 1000  # repeat r draws its instances with seed + 1000 r
# A KV context's number of keys is fitted on this many contexts whatever n is, so that instance i
# is the same for every n (a larger n resumes and scores only the new contexts).
FIT_CONTEXTS = 4


@dataclass
class MapConfig:
    """Everything a map run needs (the CLI builds one; every function of the map takes it).

    ``lengths``: length specs, tokens (``"2048"``) or fractions of the window (``"0.25w"``).
    ``methods``: labels as in ``posbias compare`` (``none``, ``pi@factor=0.9``, ...), the first the
    reference of every difference. ``method_options``: per method name (the compare flags).
    ``repeats``: independent instance sets (seeds ``seed + 1000 r``), the run-to-run noise floor.
    ``mode``: ``teacher-forced`` or ``both`` (greedy generation on the wrong answers, classified).
    ``threshold``: the middle-third accuracy below which a length counts as beyond the effective length.
    """

    model: str
    out: str
    task: str = "kv"
    lengths: list[str] = field(default_factory=lambda: list(DEFAULT_LENGTHS))
    depths: list[float] = field(default_factory=lambda: list(DEFAULT_DEPTHS))
    methods: list[str] = field(default_factory=lambda: ["none"])
    method_options: dict[str, dict[str, Any]] = field(default_factory=dict)
    n: int = 10
    seed: int = 0
    repeats: int = 1
    mode: str = "teacher-forced"
    threshold: float = 0.5
    task_options: dict[str, Any] = field(default_factory=dict)
    batch_size: int = 8
    max_new_tokens: int | None = None  # greedy generation of wrong answers (mode both); None: generation_budget
    bootstrap: int = 1000
    attention: bool = False

    def settings(self) -> dict:
        """The run folder's recorded settings (everything but ``out``)."""
        return {k: v for k, v in asdict(self).items() if k != "out"}


@dataclass(frozen=True)
class Length:
    """One prompt length of the grid: its spec as given and its target in tokens."""

    spec: str
    tokens: int


def parse_length(spec: str) -> tuple[float, bool]:
    """``"2048"`` -> ``(2048, False)``; ``"0.25w"`` -> ``(0.25, True)`` (a fraction of the window)."""
    text = str(spec).strip().lower()
    m = re.fullmatch(r"(\d+(?:\.\d+)?|\.\d+)(w?)", text)
    if not m:
        raise ValueError(f"--lengths: {spec!r} is neither a token count (2048) nor a fraction of the window (0.25w)")
    value, frac = float(m.group(1)), bool(m.group(2))
    if frac and not 0 < value <= 1:
        raise ValueError(f"--lengths: {spec!r}: a fraction of the window must be in (0, 1]")
    if not frac and (value != int(value) or value < 16):
        raise ValueError(f"--lengths: {spec!r}: a length in tokens must be a whole number >= 16")
    return value, frac


def resolve_length(spec: str, window: int, cap: int | None = None) -> Length:
    """One length spec in tokens; a length beyond the window is refused."""
    value, frac = parse_length(spec)
    if frac:
        if not window:
            raise ValueError(f"--lengths {spec}: the model has no window (max_position_embeddings); give tokens")
        tokens = int(value * (min(window, cap) if cap else window))
    else:
        tokens = int(value)
    if window and tokens > window:
        raise ValueError(f"--lengths {spec}: {tokens} tokens is longer than the model's window ({window})")
    return Length(str(spec), tokens)


def map_lengths(cfg: MapConfig, window: int) -> list[Length]:
    """The grid's lengths for a model with ``window`` positions: the default fractions count the
    window as at most :data:`DEFAULT_WINDOW_CAP` tokens (512 .. 4,096 tokens on an 8K+ model)."""
    cap = DEFAULT_WINDOW_CAP if list(cfg.lengths) == list(DEFAULT_LENGTHS) else None
    out = sorted((resolve_length(s, window, cap) for s in cfg.lengths), key=lambda x: x.tokens)
    tokens = [x.tokens for x in out]
    if len(set(tokens)) != len(tokens):
        raise ValueError(f"--lengths {','.join(cfg.lengths)} give the same token count twice ({tokens})")
    return out


def check_map(cfg: MapConfig) -> None:
    """Every check that needs no model: task, its options, depths, lengths, methods, counts."""
    if cfg.task not in MAP_TASKS:
        raise ValueError(f"--task {cfg.task!r}: the map runs {', '.join(MAP_TASKS)}")
    if cfg.mode not in MAP_MODES:
        raise ValueError(f"--mode {cfg.mode!r}: choose {' or '.join(MAP_MODES)}")
    if not 0 < cfg.threshold < 1:
        raise ValueError(f"--threshold must be between 0 and 1, got {cfg.threshold}")
    for name in ("n", "repeats", "batch_size", "bootstrap"):
        check_int(name, getattr(cfg, name))
    if cfg.max_new_tokens is not None:
        check_int("max_new_tokens", cfg.max_new_tokens)
    if {"length", "num_keys", "num_docs"} & set(cfg.task_options):
        raise ValueError("the map sets each prompt's length itself: give --lengths, not a length, num_keys or num_docs "
                         "option")
    if cfg.attention:
        check_records(cfg.task)
    if not cfg.lengths:
        raise ValueError("--lengths is empty")
    for spec in cfg.lengths:
        parse_length(spec)
    check_request(cfg.task, n=cfg.n, depths=list(cfg.depths), seed=cfg.seed, **task_options_for(cfg, 64))
    if cfg.task == "kv-uuid" and cfg.task_options.get("path") is not None:
        _file_keys(cfg.task_options["path"])  # a missing or malformed data file fails here
    if cfg.task == "mdqa":  # the data file, read and checked (and n against its examples) before any model loads
        make_instances("mdqa", n=cfg.n, depths=[0.0], seed=cfg.seed, **{**cfg.task_options, "num_docs": 3})
    check_method_list(list(cfg.methods))
    for label in cfg.methods:
        check_method(*variant_options(label, cfg.method_options))


def task_options_for(cfg: MapConfig, tokens: int) -> dict[str, Any]:
    """The task options of one length: ``length`` for passkey / NIAH, the shared-context form where
    the task has one (NIAH: one needle per depth), plus the user's options."""
    opts: dict[str, Any] = {}
    if cfg.task in ("passkey", "niah"):
        opts["length"] = int(tokens)
    if cfg.task == "kv":
        opts["shared_context"] = True
    if cfg.task == "niah":
        opts.update(shared_context=True, num_needles=max(2, len(cfg.depths)))
    return {**opts, **cfg.task_options}


def fit_items(make: Callable[[int], list], tokenizer, length: int, max_items: int | None, minimum: int = 2,
              what: str = "keys") -> int:
    """The largest number of items (keys, documents; at least ``minimum``) whose longest prompt + answer fits
    ``length`` tokens. ``make(count)`` builds the instances the fit looks at (one per context is enough);
    ``fit_units`` searches the count beyond the minimum."""
    def tokens(extra: int) -> int:
        encoded = (encode(tokenizer, i, False) for i in make(extra + minimum))
        return max(len(e.prompt_ids) + len(e.answer_ids) for e in encoded)

    top = None if max_items is None else max_items - minimum
    return minimum + fit_units(tokens, length, max_units=top, what="the prompt",
                                 smallest=f"with its fewest {what} ({minimum})")


def grid_instances(cfg: MapConfig, tokenizer, length: Length, repeat: int) -> list:
    """The instances of one length and one repeat: ``n`` contexts, each asked at every depth."""
    seed = cfg.seed + REPEAT_SEED_STRIDE * repeat
    opts = task_options_for(cfg, length.tokens)

    option = {"kv": "num_keys", "kv-uuid": "num_keys", "mdqa": "num_docs"}.get(cfg.task)

    def make(count: int | None = None, n: int = cfg.n, depths=tuple(cfg.depths)) -> list:
        extra = {} if count is None else {option: count}
        return make_instances(cfg.task, tokenizer=tokenizer, n=n, depths=list(depths), seed=seed, **opts, **extra)

    if option is None:
        return make()
    if cfg.task == "mdqa":
        top, minimum, what = None, 3 if is_hotpotqa(opts.get("path", "")) else 2, "documents"
    else:
        top = len(WORDS) // int(opts.get("key_words", 1)) if cfg.task == "kv" else _file_keys(opts.get("path"))
        minimum, what = 2, "keys"
    count = fit_items(lambda k: make(k, n=FIT_CONTEXTS, depths=(cfg.depths[-1],)), tokenizer, length.tokens, top,
                      minimum, what)
    return make(count)


def _file_keys(path) -> int:
    """Keys per example of a lost-in-the-middle KV file (the smallest), or 300 for generated UUIDs."""
    if path is None:
        return 300

    return min(len(d["records"]) for d in load_kv_file(path))


def gold_distance(tokenizer, inst, prompt_tokens: int) -> int | None:
    """Tokens between the start of the gold value in the prompt and the prompt's end (where the
    answer begins): the distance from the gold item to the question. None when the gold value is
    not written in the prompt."""
    text = prompt_text(tokenizer, inst, False)
    at = text.find(str(inst.answers[0]))
    if at < 0:
        return None
    return prompt_tokens - len(tokenizer(text[:at], add_special_tokens=True)["input_ids"])


def record_key(rec: dict) -> tuple:
    """What identifies one scored question in ``results.jsonl``."""
    return (rec["method"], int(rec["repeat"]), int(rec["length"]), rec["id"])


def score_group(model, tokenizer, group: Sequence, cfg: MapConfig, *, shared: bool = True) -> list[dict]:
    """Teacher-forced records of one scoring unit (:func:`question_groups`); with ``mode="both"``
    the wrong answers are generated greedily and classified (:mod:`posbias.evaluation.map_failures`)."""
    scores = score_instances(model, tokenizer, group, batch_size=cfg.batch_size, shared=shared)
    records = []
    for inst, s in zip(group, scores):
        records.append({"id": inst.id, "depth": float(inst.depth), "index": int(inst.id.rsplit("_i", 1)[1]),
                        "correct": float(s["em"]), "tf_logprob": float(s["logprob"]), "n_tokens": int(s["n_tokens"]),
                        "prompt_tokens": int(s["prompt_tokens"]), "gold_index": inst.gold_index,
                        "num_items": inst.num_items,
                        "distance_tokens": gold_distance(tokenizer, inst, int(s["prompt_tokens"])),
                        **({"em_form": s["em_form"]} if "em_form" in s else {}),
                        **{k: v for k, v in s.items() if k.startswith("attn_")}})
    if cfg.mode == "both":
        classify_group(model, tokenizer, group, records, cfg)
    return records


def prefills_of(group: Sequence, model, shared: bool) -> int:
    """Prompt prefills one scoring unit costs: one per shared context, else one per question."""
    if shared and not prompt_dependent(model) and group and group[0].meta.get("context_id") is not None:
        return 1
    return len(group)


def open_map(cfg: MapConfig, load=None):
    """Check the request and its run folder (nothing written); returns the :class:`RunFolder`.
    ``load``: the model's :class:`~posbias.models.options.LoadOptions` (its resolved dtype is a resume key)."""
    check_map(cfg)
    adapter = map_adapter(cfg)
    # out: not compared on resume; makes config.json usable as --config
    return open_run(cfg.out, "map", {**cfg.settings(), "out": str(cfg.out), **load_settings(cfg.model, load),
                                     **({"adapter": adapter} if adapter else {})},
                    check_keys=(*MAP_RESUME_KEYS, "dtype"), upgrade=upgrade_map_settings)


def upgrade_map_settings(old: dict) -> dict:
    """A map folder's settings as this posbias records them: older versions recorded a fixed generation
    limit of 16, which the default budget (:func:`~posbias.evaluation.generation.generation_budget`, at
    least 16) equals for every answer but a UUID's; a kv-uuid map that generated keeps 16 (resuming it
    under a larger limit would mix cut and whole answers) and is refused."""
    old = {"attention": False, **old}  # folders from before the attention diagnostic ran without it
    if old.get("max_new_tokens") == 16 and not (old.get("task") == "kv-uuid" and old.get("mode") == "both"):
        return {**old, "max_new_tokens": None}
    return old


def map_adapter(cfg: MapConfig) -> dict | None:
    """What the run folder records when ``cfg.model`` is a folder written by ``posbias apply`` (its method,
    options, base model; the model loads with them active, so the label ``none`` scores them), else None.
    Another method on top of the folder's is refused (:func:`posbias.models.adapter.eval_settings`)."""
    for label in cfg.methods:
        eval_settings(cfg.model, *variant_options(label, cfg.method_options))
    return adapter_record(cfg.model)


def run_map(cfg: MapConfig, loaded=None, log: Callable[[str], None] = print, load=None) -> dict:
    """Score the whole grid into ``cfg.out`` (resuming), then write the summary and the figures;
    returns the summary (:func:`posbias.evaluation.map_summary.write_summary`). ``load``: device, dtype
    and Hub revision of the model (:class:`~posbias.models.options.LoadOptions`; default CPU float32)."""
    folder = open_map(cfg, load)
    if loaded is None:
        loaded = load_model(cfg.model, load)
    lm, tok = loaded
    lengths = map_lengths(cfg, model_max_positions(lm))
    score_grid(cfg, folder, lm, tok, lengths, log)
    summary = write_summary(cfg, folder.path, lengths)
    plot_map(cfg, folder.path, summary)
    return summary


def score_grid(cfg: MapConfig, folder, model, tokenizer, lengths: list[Length],
               log: Callable[[str], None] = print) -> None:
    """Score every (method, repeat, length) not yet in ``results.jsonl``; one ``metrics.jsonl`` line
    per finished (method, repeat, length) with its time, prefills and questions."""
    results = folder.path / "results.jsonl"
    existing = repair_jsonl(results)
    done = {record_key(r) for r in existing}
    built: dict[tuple[int, int], list] = {}
    per_row = cfg.n * len(cfg.depths)
    depths = {round(float(d), 6) for d in cfg.depths}
    counts = Counter((r["method"], r["repeat"], r["length"]) for r in existing
                     if r["index"] < cfg.n and round(float(r["depth"]), 6) in depths)
    total = per_row * cfg.repeats * len(lengths) * len(cfg.methods)
    already = sum(min(c, per_row) for (m, rep, _), c in counts.items() if m in cfg.methods and rep < cfg.repeats)
    if already:
        announce_resume(already, total, "questions", folder.path)
    for label in cfg.methods:
        with (applied_method(model, *variant_options(label, cfg.method_options)) as scored,
              AttentionProbe(scored) if cfg.attention else contextlib.nullcontext()):
            for repeat in range(cfg.repeats):
                for length in lengths:
                    if counts[(label, repeat, length.tokens)] >= per_row:  # resumed: nothing left to build
                        continue
                    key = (repeat, length.tokens)
                    if key not in built:
                        built[key] = grid_instances(cfg, tokenizer, length, repeat)
                    todo = [i for i in built[key] if (label, repeat, length.tokens, i.id) not in done]
                    if todo:
                        _score_cell_row(cfg, folder, scored, tokenizer, todo, label, repeat, length, log)


def _score_cell_row(cfg, folder, model, tokenizer, todo, label, repeat, length, log) -> None:
    start, prefills = time.perf_counter(), 0
    for group in question_groups(todo, cfg.batch_size, shared=True):
        records = score_group(model, tokenizer, group, cfg)
        prefills += prefills_of(group, model, True)
        folder.commit()
        for rec in records:
            append_jsonl(folder.path / "results.jsonl",
                         {"method": label, "repeat": repeat, "length": length.tokens, "length_spec": length.spec,
                          **rec})
    seconds = time.perf_counter() - start
    append_jsonl(folder.path / "metrics.jsonl", {"method": label, "repeat": repeat, "length": length.tokens,
                                                 "questions": len(todo), "prefills": prefills,
                                                 "seconds": round(seconds, 2)})
    log(f"{label} repeat {repeat} length {length.tokens}: {len(todo)} questions, {prefills} prefills, {seconds:.1f} s")
