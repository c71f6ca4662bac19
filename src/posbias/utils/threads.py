"""How many CPU threads torch may use in a posbias command, and a warning when other jobs hold cores.

torch starts one intra-op thread per core. When another process keeps one of those cores busy, every
parallel region waits for the thread that shares it, and small-model work slows down many times
(measured here: ``make demo`` took 1,389 s instead of 187 s beside one single-threaded training job
on a 2-core machine). ``posbias --threads N`` (or ``OMP_NUM_THREADS=N``) avoids that."""
from __future__ import annotations

import os

import torch

THREADS_ENV = "POSBIAS_THREADS"  # the --threads budget, read by spawned workers too
NO_HINT_ENV = "POSBIAS_NO_LOAD_HINT"  # set to silence the busy-core warning (the tests do)
LOADAVG = "/proc/loadavg"


def cpu_cores() -> int:
    """Cores this process may run on (its CPU affinity where the OS reports it)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - macOS / Windows
        return os.cpu_count() or 1


def thread_budget() -> int:
    """Torch threads a command uses in all: ``--threads`` (``POSBIAS_THREADS``), else
    ``OMP_NUM_THREADS``, else one per core."""
    for name in (THREADS_ENV, "OMP_NUM_THREADS"):
        value = os.environ.get(name, "")
        if value.isdigit() and int(value) > 0:
            return int(value)
    return cpu_cores()


def busy_cores(loadavg_text: str) -> tuple[int, float]:
    """Cores other work holds, from the text of ``/proc/loadavg`` (``"1.02 0.83 1.47 3/345 12345"``):
    the processes runnable right now besides the reader itself, capped by the 1-minute load average
    rounded (so a job that just ended does not count, nor a momentary burst). Returns (busy, load)."""
    fields = loadavg_text.split()
    load, running = float(fields[0]), int(fields[3].split("/")[0]) - 1
    return max(0, min(running, int(load + 0.5))), load


def busy_core_hint(threads: int, cores: int, busy: int, load: float) -> str | None:
    """One warning line when ``threads`` torch threads would share cores with ``busy`` cores of other
    running work (``load``: the 1-minute load average, for the message), else None."""
    busy = min(cores, busy)
    free = max(1, cores - busy)
    if busy == 0 or threads <= free:
        return None
    advice = "keeps to the free cores" if busy < cores else "slows it least (every core is busy)"
    return (f"note: about {busy} of {cores} CPU cores are busy (1-minute load {load:.1f}) and torch would use "
            f"{threads} threads, which can run many times slower beside other jobs; "
            f"`posbias --threads {free} ...` (or OMP_NUM_THREADS={free}) {advice}")


def apply_threads(threads: int | None) -> str | None:
    """Set the command's thread budget (``None``: keep torch's default) for this process and its spawned
    workers; returns the busy-core warning to print, if any."""
    hint = None
    if not os.environ.get(NO_HINT_ENV):
        try:  # read before torch starts threads of its own
            with open(LOADAVG) as f:
                busy, load = busy_cores(f.read())
        except (OSError, ValueError, IndexError):  # pragma: no cover - no /proc (macOS, Windows)
            busy, load = 0, 0.0
        hint = busy_core_hint(threads or thread_budget(), cpu_cores(), busy, load)
    if threads is not None:
        os.environ[THREADS_ENV] = str(threads)

        torch.set_num_threads(threads)
    return hint
