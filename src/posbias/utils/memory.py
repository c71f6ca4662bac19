"""Allocator settings for long-context work on CPU, and the memory a process holds (CPU and GPU).

Exact attention at 16K+ tokens allocates and frees blocks of tens of MB per query chunk. glibc's
default malloc returns such blocks to the kernel at once (``mmap`` / heap trimming), so every block
is page-faulted and zeroed again: on the 2-core machine that kernel time was as large as the
arithmetic itself. :func:`keep_freed_memory` makes freed memory stay in the process (``mallopt``:
mmap threshold 32 MB, 512 MB of top padding, no trimming below 2 GB), which the next chunk reuses.
Results are unchanged; only where the bytes come from differs. The price: the process keeps what it
freed (up to ~2.5 GB resident after a long-context run) until it exits. Set ``POSBIAS_MALLOC_TUNING=0``
to keep the defaults; nothing happens on non-glibc systems. It is applied by the first chunked
attention call (:func:`posbias.attention.attend`), not at import.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import gc
import os
import sys

import torch

M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_THRESHOLD = -1, -2, -3  # glibc <malloc.h>
SETTINGS = ((M_MMAP_THRESHOLD, 32 << 20), (M_TOP_PAD, 512 << 20), (M_TRIM_THRESHOLD, (1 << 31) - 1))
_state: dict[str, bool] = {}  # "applied": the outcome of the one attempt per process


def keep_freed_memory() -> bool:
    """Apply :data:`SETTINGS` once per process; True when glibc accepted them. Later calls only return
    that outcome (it sits on the chunked-attention path: no library lookup is retried)."""
    if "applied" not in _state:
        _state["applied"] = os.environ.get("POSBIAS_MALLOC_TUNING", "1") != "0" and _mallopt_all()
    return _state["applied"]


def _mallopt_all() -> bool:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc (macOS, musl without mallopt, Windows)
        return False
    return all(mallopt(option, value) == 1 for option, value in SETTINGS)


def reset_peak_rss() -> bool:
    """Restart the kernel's resident-memory high-water mark (Linux ``/proc/self/clear_refs`` = 5), so
    :func:`peak_rss_mb` then reports the peak since this call; False where that is not possible."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def peak_rss_mb() -> float:
    """Peak resident memory in MB: since the last :func:`reset_peak_rss` on Linux (``VmHWM``; it
    includes freed memory the allocator keeps for reuse), else the process's peak (``ru_maxrss``)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    import resource  # noqa: PLC0415 (Unix only: off Linux, and Windows has none)

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 1024  # bytes on macOS, KB elsewhere


def gpu_memory_gib(device: torch.device, peak: bool = False) -> float | None:
    """GPU memory this process holds in GiB, summed over the visible GPUs (the one a model is on, or all
    of them for ``--device shard``); ``peak``: the sum of each GPU's high-water mark since
    :func:`reset_gpu_peaks`. None when ``device`` (where the work runs) is not a CUDA device."""
    if device.type != "cuda":
        return None
    read = torch.cuda.max_memory_allocated if peak else torch.cuda.memory_allocated
    return sum(read(i) for i in range(torch.cuda.device_count())) / 2**30


def release_cached_memory(device: torch.device) -> None:
    """Free what this process no longer references and, on a CUDA ``device``, hand the allocator's cached
    blocks back (so another process, or a fresh peak measurement, starts from what is really held)."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def reset_gpu_peaks() -> None:
    """Restart every visible GPU's high-water mark (after its queued work is done); nothing without CUDA."""
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            torch.cuda.synchronize(i)
            torch.cuda.reset_peak_memory_stats(i)


__all__ = ["gpu_memory_gib", "keep_freed_memory", "peak_rss_mb", "release_cached_memory", "reset_gpu_peaks",
           "reset_peak_rss", "SETTINGS"]
