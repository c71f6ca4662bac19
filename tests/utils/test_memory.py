import sys

import pytest

from posbias.utils import memory


def test_opt_out_leaves_the_allocator_alone(monkeypatch):
    monkeypatch.setattr(memory, "_done", False)
    monkeypatch.setenv("POSBIAS_MALLOC_TUNING", "0")
    assert memory.keep_freed_memory() is False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc mallopt")
def test_glibc_accepts_the_settings(monkeypatch):
    monkeypatch.setattr(memory, "_done", False)
    monkeypatch.delenv("POSBIAS_MALLOC_TUNING", raising=False)
    assert memory.keep_freed_memory() is True
    assert memory.keep_freed_memory() is True  # once per process; the second call does nothing
