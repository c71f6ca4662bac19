"""Allocator settings for long-context work on CPU.

Exact attention at 16K+ tokens allocates and frees blocks of tens of MB per query chunk. glibc's
default malloc returns such blocks to the kernel at once (``mmap`` / heap trimming), so every block
is page-faulted and zeroed again: on the 2-core machine that kernel time was as large as the
arithmetic itself. :func:`keep_freed_memory` makes freed memory stay in the process (``mallopt``:
mmap threshold 32 MB, 512 MB of top padding, no trimming below 2 GB), which the next chunk reuses.
Results are unchanged; only where the bytes come from differs. Set ``POSBIAS_MALLOC_TUNING=0`` to
keep the defaults; nothing happens on non-glibc systems.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os

M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_THRESHOLD = -1, -2, -3  # glibc <malloc.h>
SETTINGS = ((M_MMAP_THRESHOLD, 32 << 20), (M_TOP_PAD, 512 << 20), (M_TRIM_THRESHOLD, (1 << 31) - 1))
_done = False


def keep_freed_memory() -> bool:
    """Apply :data:`SETTINGS` once per process; True when glibc accepted them."""
    global _done
    if _done or os.environ.get("POSBIAS_MALLOC_TUNING", "1") == "0":
        return _done
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc (macOS, musl without mallopt, Windows)
        return False
    _done = all(mallopt(option, value) == 1 for option, value in SETTINGS)
    return _done


__all__ = ["keep_freed_memory", "SETTINGS"]
