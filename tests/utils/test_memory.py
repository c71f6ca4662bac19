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


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/self/clear_refs")
def test_peak_rss_restarts_at_each_reset():
    block = bytearray(200 * 2**20)
    block[:: 4096] = b"x" * len(block[:: 4096])  # touch every page
    high = memory.peak_rss_mb()
    del block
    assert memory.reset_peak_rss()
    assert memory.peak_rss_mb() < high - 150  # the freed 200 MB no longer count
