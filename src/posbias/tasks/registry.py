"""Task registry and the single entry point :func:`make_instances`."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from posbias.tasks.base import MAX_PER_DEPTH, Instance, check_depth, check_int, check_split
from posbias.tasks.kv import make_kv, make_kv_uuid
from posbias.tasks.mdqa import make_mdqa, relabel_document
from posbias.tasks.niah import make_niah
from posbias.tasks.passkey import make_passkey
from posbias.tasks.reorder import reordered


@dataclass(frozen=True)
class TaskSpec:
    name: str
    factory: Callable[..., list[Instance]]
    options: dict[str, Any] = field(default_factory=dict)  # option -> default (None: see doc)
    needs_tokenizer: bool = False
    metric: str = ""
    description: str = ""
    records: bool = False  # made of records / documents with character spans (meta["item_spans"])
    relabel: Callable[[str, int], str] | None = None  # a record's text numbered for another position (reorder)


TASKS: dict[str, TaskSpec] = {
    "kv": TaskSpec("kv", make_kv, {"num_keys": 30, "value_digits": 7, "key_words": 1, "shared_context": False,
                                   "closing": "", "query_aware": False},
                   False, "substring", "word keys -> 7-digit numbers, one 'key: value' per line "
                   "(key_words=2: compound keys; shared_context: one list asked at every depth; closing: a line after "
                   "the records; query_aware: the key before the records too)", records=True),
    "kv-uuid": TaskSpec("kv-uuid", make_kv_uuid, {"num_keys": None, "path": None}, False, "substring",
                        "lost-in-the-middle JSON of UUIDs (generated, 75 keys by default, or from path)", records=True),
    "mdqa": TaskSpec("mdqa", make_mdqa, {"path": None, "num_docs": 10, "query_aware": False}, False,
                     "best_subspan_em",
                     "multi-document QA, gold document moved (path: an NQ-Open file, or hotpotqa for HotpotQA's "
                     "hard distractors; query_aware: the question before the documents too)", records=True,
                     relabel=relabel_document),
    "passkey": TaskSpec("passkey", make_passkey, {"length": 1024, "digits": 5, "haystack": "noise",
                                                  "protocol": "posbias", "given_digits": 0}, True, "passkey",
                        "Landmark passkey in the grass-is-green filler (haystack=essay: Paul Graham "
                        "sentences), fitted to length tokens; protocol=bam: the BAM reference's prompt (digits "
                        "scored, not the space), given_digits=1: the key's first digit given"),
    "niah": TaskSpec("niah", make_niah, {"haystack": "noise", "num_needles": 1, "num_values": 1,
                                         "num_queries": 1, "length": 1024, "shared_context": False},
                     True, "string_match_all",
                     "RULER needle in a haystack (noise/essay/needle), fitted to length tokens"),
}


def check_request(name: str, *, n: int, depths: list[float], seed: int = 0, split: str = "eval",
                  **options: Any) -> list[float]:
    """Validate a request for instances without building any (task, option names, ``n``, ``seed``,
    ``split``, ``depths``); returns the depths as floats."""
    spec = TASKS.get(name)
    if spec is None:
        raise ValueError(f"unknown task {name!r}; known tasks: {', '.join(TASKS)}")
    unknown = sorted(set(options) - set(spec.options))
    if unknown:
        raise ValueError(f"unknown option(s) {', '.join(map(repr, unknown))} for task {name!r}; "
                         f"valid options: {', '.join(f'{k} (default {v!r})' for k, v in spec.options.items())}")
    for key, value in options.items():
        if isinstance(spec.options[key], bool) and not isinstance(value, bool):
            raise ValueError(f"task option {key} must be true or false, got {value!r}")
    check_int("n", n, maximum=MAX_PER_DEPTH)
    check_int("seed", seed, minimum=0)
    check_split(split)
    if isinstance(depths, (int, float)) or isinstance(depths, str):
        raise ValueError(f"depths must be a list of numbers in [0, 1], got {depths!r}")
    depths = list(depths)
    if not depths:
        raise ValueError("depths is empty")
    for d in depths:
        if isinstance(d, bool) or not isinstance(d, (int, float)) and not hasattr(d, "__float__"):
            raise ValueError(f"depth {d!r} is not a number")
        check_depth(d)
    depths = [float(d) for d in depths]
    if len(set(depths)) != len(depths):
        raise ValueError(f"depths contain duplicates: {depths}")
    return depths


def precheck_instances(name: str, *, n: int, depths: list[float], seed: int = 0, split: str = "eval",
                       **options: Any) -> list[Instance] | None:
    """The checks worth running before a model is loaded: :func:`check_request`, and for a task that
    needs no tokenizer the instances themselves (which reads and validates its data file).

    Returns those instances, or None for a task whose prompts are fitted with the tokenizer."""
    check_request(name, n=n, depths=depths, seed=seed, split=split, **options)
    if TASKS[name].needs_tokenizer:
        return None
    return make_instances(name, n=n, depths=depths, seed=seed, split=split, **options)


def check_length(name: str, options: dict[str, Any], max_positions: int) -> None:
    """Refuse a fitted task's target ``length`` beyond what the model holds (``max_positions``; 0 =
    no limit) before any haystack is fitted to it."""
    spec = TASKS.get(name)
    if spec is None or "length" not in spec.options or not max_positions:
        return
    length = options.get("length", spec.options["length"])
    if isinstance(length, int) and not isinstance(length, bool) and length > max_positions:
        raise ValueError(f"length {length} is longer than the model holds ({max_positions} positions); "
                         f"give --length <= {max_positions}")


def make_instances(name: str, *, tokenizer: Any = None, n: int, depths: list[float], seed: int = 0,
                   split: str = "eval", **options: Any) -> list[Instance]:
    """Seeded instances of task ``name``: ``n`` per depth, all of ``depths[0]`` first, then
    ``depths[1]``, ... The same content is used at every depth (only the gold item moves)."""
    depths = check_request(name, n=n, depths=depths, seed=seed, split=split, **options)
    spec = TASKS[name]
    n, seed = int(n), int(seed)
    if spec.needs_tokenizer and tokenizer is None:
        raise ValueError(f"task {name!r} needs tokenizer=... to fit the prompt to `length` tokens")
    instances = spec.factory(tokenizer=tokenizer, n=n, depths=depths, seed=seed, split=split,
                             **{**spec.options, **options})
    ids = [x.id for x in instances]
    assert len(set(ids)) == len(ids), "duplicate instance ids"
    return instances


def check_records(name: str) -> None:
    """Refuse a task without records for what reads them (the attention diagnostic)."""
    if not TASKS[name].records:
        have = ", ".join(t for t, spec in TASKS.items() if spec.records)
        raise ValueError(f"task {name!r} is not made of records: the attention diagnostic covers {have}")


def supports_shared_context(task: str, task_options: dict) -> bool:
    """Whether ``task`` with these options has a shared-context form (``kv``; ``niah`` with several
    needles and one query, the multi-key setting)."""
    if task == "kv":
        return True
    if task == "niah":
        return int(task_options.get("num_needles", 1)) >= 2 and int(task_options.get("num_queries", 1)) == 1
    return False


def reordered_instance(inst: Instance, order: list[int]) -> Instance:
    """``inst`` with its records shown in ``order`` (:func:`posbias.tasks.reorder.reordered`), labels renumbered
    where its task numbers them."""
    return reordered(inst, order, TASKS[inst.task].relabel if inst.task in TASKS else None)
