"""The task instance every generator yields and every scorer consumes."""
from __future__ import annotations

import zlib
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np

from posbias.utils.options import check_int  # noqa: F401 (task generators check counts with it)


@dataclass
class Instance:
    """One seeded evaluation example.

    Attributes:
        id: stable identifier (task, seed, index and depth), used to resume runs.
        task: task name, e.g. ``"kv"``.
        prompt: the full user prompt (chat template not yet applied).
        answers: gold answers; the first one is the teacher-forced target.
        gold_index: index of the item holding the needed fact (0-based).
        num_items: number of items (keys, documents, needles) in the input.
        depth: the requested relative depth of the gold item (0 = beginning, 1 = end); the
            generators place the gold at ``gold_index = round(depth * (num_items - 1))`` and store
            the realised ``gold_index / (num_items - 1)`` in ``meta["realised_depth"]``.
        metric: name of the metric in ``posbias.evaluation.metrics`` that scores a prediction.
        answer_prefix: text the assistant's answer starts with (part of the prompt when scored).
        meta: task-specific extras (e.g. all expected values for multi-value NIAH). Tasks made of
            records or documents give their character spans in the prompt as ``meta["item_spans"]``
            (``[[start, end], ...]``, one per item in shown order) and, where the gold is more than
            one item, ``meta["gold_items"]`` (the attention diagnostic and record-aware methods read
            them; :func:`render_items` builds both prompt and spans).
    """

    id: str
    task: str
    prompt: str
    answers: list[str]
    gold_index: int
    num_items: int
    depth: float
    metric: str
    answer_prefix: str = ""
    meta: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def depth_to_index(depth: float, num_items: int) -> int:
    """Map a relative depth in [0, 1] to an item index (``round(depth * (n - 1))``)."""
    check_depth(depth)
    return int(round(depth * (num_items - 1)))


def check_depth(depth: float) -> None:
    if not (0.0 <= float(depth) <= 1.0):
        raise ValueError(f"depth {depth} is outside [0, 1] (0 = beginning, 1 = end of the input)")


TaskFactory = Callable[..., Iterator[Instance]]


def render_items(template: str, placeholder: str, items: list[str], sep: str = "\n", **fields: Any
                 ) -> tuple[str, list[list[int]]]:
    """``template`` with ``{placeholder}`` replaced by ``items`` joined with ``sep`` and its other
    fields filled in; returns ``(prompt, spans)``, ``spans[i] = [start, end]`` the characters of
    ``items[i]`` in the prompt (``prompt[start:end] == items[i]``)."""
    head, tail = template.split("{" + placeholder + "}")
    head, tail = head.format(**fields), tail.format(**fields)
    spans, at = [], len(head)
    for item in items:
        spans.append([at, at + len(item)])
        at += len(item) + len(sep)
    return head + sep.join(items) + tail, spans


# ---------------------------------------------------------------------------------------------
# Helpers shared by the generators (seeds, ids, option checks).

SPLITS = ("search", "eval")
# Bounds on counts a user gives: beyond them a request would only spin and fill memory (1e11 instances).
MAX_PER_DEPTH = 100_000  # instances per depth
MAX_ITEMS = 100_000  # keys, needles
MAX_DOCUMENTS = 10_000
MAX_LENGTH = 1 << 24  # prompt tokens
_SPLIT_CODE = {"search": 1, "eval": 2}


def check_split(split: str) -> None:
    if split not in _SPLIT_CODE:
        raise ValueError(f"split {split!r} is not one of {list(SPLITS)}")


def derive_rng(task: str, split: str, seed: int, *extra: int):
    """A ``numpy.random.Generator`` seeded from (task, split, seed, *extra), never global state.

    The two splits get different seed sequences, so generated content never coincides.
    """


    check_split(split)
    entropy = [zlib.crc32(task.encode("utf-8")), _SPLIT_CODE[split], int(seed), *map(int, extra)]
    return np.random.default_rng(np.random.SeedSequence(entropy))


def depth_seed(seed: int, depth: float) -> int:
    """The seed of the instances drawn for one depth alone (a grid's ``per-depth`` needle draw): a
    deterministic 31-bit hash of ``(seed, depth)``, so every depth gets its own needles, the same in
    every run, whichever other depths are asked. Its instance ids carry it (``s<depth seed>``)."""

    return zlib.crc32(f"{int(seed)}@{float(depth)!r}".encode("ascii")) & 0x7FFFFFFF


def instance_id(task: str, split: str, seed: int, depth: float, index: int) -> str:
    """Stable, unique id, e.g. ``kv_eval_s0_d0.5_i3``."""
    return f"{task}_{split}_s{int(seed)}_d{float(depth)!r}_i{int(index)}"


def realised_depth(gold_index: int, num_items: int) -> float:
    """``gold_index / (num_items - 1)`` (0.0 for a single item)."""
    return gold_index / (num_items - 1) if num_items > 1 else 0.0


class DataFileNotFoundError(FileNotFoundError, ValueError):
    """A task data file is missing (both a ``FileNotFoundError`` and a ``ValueError``)."""


def check_file(path: Any, option: str = "path"):
    """``Path(path)``, raising :class:`DataFileNotFoundError` when it is not an existing file."""

    p = Path(path)
    if not p.is_file():
        raise DataFileNotFoundError(f"{option}={str(path)!r}: data file not found")
    return p
