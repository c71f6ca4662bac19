import sys

import pytest

from posbias.utils import memory


def test_opt_out_leaves_the_allocator_alone(monkeypatch):
    monkeypatch.setattr(memory, "_state", {})
    monkeypatch.setenv("POSBIAS_MALLOC_TUNING", "0")
    assert memory.keep_freed_memory() is False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc mallopt")
def test_glibc_accepts_the_settings(monkeypatch):
    monkeypatch.setattr(memory, "_state", {})
    monkeypatch.delenv("POSBIAS_MALLOC_TUNING", raising=False)
    assert memory.keep_freed_memory() is True
    assert memory.keep_freed_memory() is True  # once per process; the second call does nothing


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/self/clear_refs")
def test_peak_rss_restarts_at_each_reset():
    assert memory.reset_peak_rss()
    before = memory.peak_rss_mb()
    import mmap

    block = mmap.mmap(-1, 200 * 2**20)  # its own mapping: returned to the kernel on close, whatever malloc keeps
    for offset in range(0, len(block), 4096):  # touch every page
        block[offset] = 1
    high = memory.peak_rss_mb()
    assert high > before + 150  # the block counts while it lives
    block.close()
    assert memory.reset_peak_rss()
    assert memory.peak_rss_mb() < high - 150  # and no longer once freed and the mark restarted
