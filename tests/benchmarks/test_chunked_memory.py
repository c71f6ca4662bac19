"""benchmarks/chunked_memory.py: the exact chunked path's peak memory stays linear in the length."""
from __future__ import annotations

import os

import pytest
from conftest import load_benchmark


@pytest.mark.skipif(not os.access("/proc/self/clear_refs", os.W_OK), reason="needs Linux's resettable peak RSS")
def test_chunked_attention_memory_does_not_grow_with_the_square_of_the_length():
    """16K tokens, 4 heads, one layer, under the package's allocator settings: one full score matrix
    would be 4 GiB; the chunked path needs ~150 MiB above the model. When every chunk's output was
    kept in a list until the end, those small tensors split the heap between the freed (ever larger)
    logits blocks, which then could not be reused: +2.1 GiB here, +8.3 GiB at 32K (measured 2026-12-04)."""
    bench = load_benchmark("chunked_memory")
    (r,) = bench.main(["--lengths", "16384", "--heads", "4"])
    assert r["finite"]
    assert r["peak_mib"] < 500, r
