"""One process per run folder: an advisory lock on the folder itself while a command writes into it.

Two commands writing into one ``--out`` at once would append to the same record files, overwrite
each other's ``config.json`` and reports, and resume work the other is doing. The second one is
refused as soon as it opens the folder instead. The lock is a ``flock`` on the folder's own
descriptor (no lock file is created), taken by :func:`hold` and kept until the process ends: the
kernel drops it however the process ends, so a killed run never leaves a stale lock behind.

A process may hold any number of folders and hold one more than once (a resume inside the same
process, a parent run and its child folders); processes forked from it share its locks. A
``torchrun`` job is one command: its rank 0 holds the folders, the other ranks (``RANK`` > 0) use them
without a lock. Where the platform or file system has no ``flock`` (Windows, some network mounts)
folders are not locked.
"""
from __future__ import annotations

import errno
import os
from pathlib import Path

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None

_HELD: dict[str, int] = {}  # real path of each folder this process holds -> its open descriptor
_BUSY = (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES)


def hold(folder: str | Path) -> None:
    """Lock the existing ``folder`` for this process until it ends; ``ValueError`` naming the
    folder when another running process holds it."""
    key = os.path.realpath(folder)
    if fcntl is None or key in _HELD or os.environ.get("RANK", "0") != "0":
        return
    fd = os.open(key, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        os.close(fd)
        if e.errno in _BUSY:
            raise ValueError(f"{folder} is in use by another running posbias command; wait until it ends, "
                             "or use another --out") from None
        return  # no flock on this file system: unlocked
    _HELD[key] = fd
