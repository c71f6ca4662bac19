"""Progress of long work: a tqdm bar on a terminal, one plain line per 10% when stderr is a file.

A bar redrawn into a log file floods it; a log with nothing in it for an hour says nothing either.
:func:`progress_bar` gives the bar where a person watches it and, when stderr is not a terminal
(``nohup``, CI, ``2> log``) or :data:`LINES_ENV` is set (worker processes sharing one terminal, whose
bars would overwrite each other's line), a :class:`LineProgress` with the same ``update`` /
``set_postfix`` / ``close`` methods that prints ``desc: 30% (300/1000 inst, 42 s)`` each time another
tenth is done.
"""
from __future__ import annotations

import os
import sys
import time
from typing import Iterable, Iterator

from tqdm.auto import tqdm

LINES_ENV = "POSBIAS_PROGRESS_LINES"  # set (to anything but "") in a process: lines, never a bar


def use_progress_lines() -> None:
    """From now on this process reports progress in lines (:data:`LINES_ENV`); a worker initializer."""
    os.environ[LINES_ENV] = "1"


def progress_bar(total: int | None = None, *, desc: str = "", unit: str = "it", initial: int = 0,
                 enabled: bool = True, leave: bool = True, every: float = 0.1, **tqdm_kwargs):
    """A progress reporter for ``total`` steps: tqdm on a terminal, :class:`LineProgress` otherwise,
    a silent one when not ``enabled``."""
    if not enabled:
        return tqdm(total=total, disable=True)
    if sys.stderr.isatty() and not os.environ.get(LINES_ENV):
        return tqdm(total=total, initial=initial, desc=desc, unit=unit, leave=leave, **tqdm_kwargs)
    return LineProgress(total, desc=desc, unit=unit, initial=initial, every=every)


def progress_iter(items: Iterable, *, total: int | None = None, desc: str = "", unit: str = "it",
                  enabled: bool = True, leave: bool = True) -> Iterator:
    """``items`` with a :func:`progress_bar` advanced by one per item."""
    items = list(items) if total is None else items
    bar = progress_bar(len(items) if total is None else total, desc=desc, unit=unit, enabled=enabled, leave=leave)
    try:
        for item in items:
            yield item
            bar.update(1)
    finally:
        bar.close()


class LineProgress:
    """tqdm's ``update`` / ``set_postfix`` / ``close`` as one line on stderr per ``every`` of ``total``."""

    def __init__(self, total: int | None, *, desc: str = "", unit: str = "it", initial: int = 0, every: float = 0.1):
        self.total, self.desc, self.unit, self.n = total, desc, unit, initial
        self.step = max(1, int((total or 0) * every))
        self.next = initial - initial % self.step + self.step
        self.start = time.time()
        self.postfix = ""

    def update(self, n: int = 1) -> None:
        self.n += n
        if self.total and self.n >= self.next:
            self.next = self.n - self.n % self.step + self.step
            self._line()

    def set_postfix(self, *args, refresh: bool = True, **kwargs) -> None:
        values = {**(args[0] if args else {}), **kwargs}
        self.postfix = ", ".join(f"{k}={v}" for k, v in values.items())

    def close(self) -> None:
        pass

    def _line(self) -> None:
        pct = 100 * self.n / self.total
        extra = f", {self.postfix}" if self.postfix else ""
        print(f"{self.desc}: {pct:.0f}% ({self.n}/{self.total} {self.unit}, {time.time() - self.start:.0f} s{extra})",
              file=sys.stderr, flush=True)
