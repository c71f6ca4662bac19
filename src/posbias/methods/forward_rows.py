"""What a scorer tells a model about the forward pass it is about to run: for each batch row, which query is
its prompt's last token (the one that predicts the answer), where its prompt sits among the keys, and where
the task's records are in that prompt.

A plain model never reads it. Record-aware methods (attention calibration, :mod:`posbias.methods.calibration`)
and the attention diagnostic (:mod:`posbias.evaluation.attention_probe`) do: they act on, or look at, the
attention of the answer rows over the records. The scorers of :mod:`posbias.evaluation.scoring` set it around
every forward that holds a prompt's last token (:func:`forward_rows`); between those forwards (a context's
prefill, greedy decoding) there is none.
"""
from __future__ import annotations

import contextlib
import weakref
from dataclasses import dataclass
from typing import Sequence


@dataclass(frozen=True)
class RowView:
    """One batch row of a forward pass.

    Attributes:
        id: the instance the row scores (None: its prompt's last token is not in this forward).
        query_row: the index, among this forward's queries, of the prompt's last token; the queries after it
            are the answer's (teacher forcing).
        key_start: the cache position of the prompt's first token (after left padding).
        key_length: the prompt's tokens.
        spans: the records' token spans ``[(start, end), ...]``, relative to the prompt's first token (None:
            a task without records).
    """

    id: str | None
    query_row: int
    key_start: int
    key_length: int
    spans: tuple[tuple[int, int], ...] | None = None


@dataclass(frozen=True)
class ForwardRows:
    """The rows of one forward pass; ``total``: the keys a full-attention layer sees in it (cache + new)."""

    rows: tuple[RowView, ...]
    total: int


_CURRENT: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


@contextlib.contextmanager
def forward_rows(model, ids: Sequence[str | None], query_rows: Sequence[int], key_starts: Sequence[int],
                 key_lengths: Sequence[int], total: int, spans: Sequence | None = None):
    """The block's forward pass of ``model`` has these rows (:class:`RowView`, one per batch row)."""
    spans = spans if spans is not None else [None] * len(ids)
    rows = tuple(RowView(i, int(q), int(s), int(n), None if sp is None else tuple(map(tuple, sp)))
                 for i, q, s, n, sp in zip(ids, query_rows, key_starts, key_lengths, spans))
    _CURRENT[model] = ForwardRows(rows, int(total))
    try:
        yield
    finally:
        _CURRENT.pop(model, None)


def rows_of(model) -> ForwardRows | None:
    """The rows of ``model``'s forward pass under way (None: none was described)."""
    return _CURRENT.get(model)
