"""Fit a haystack to a token budget: the largest unit count whose prompt still fits."""
from __future__ import annotations

from typing import Callable


def fit_units(count: Callable[[int], int], length: int, *, max_units: int | None = None,
              what: str = "the prompt", smallest: str = "without any haystack") -> int:
    """Largest ``u >= 0`` with ``count(u) <= length`` (``count`` must be non-decreasing in ``u``).

    ``count(u)`` is the token count of the prompt built with ``u`` haystack units. Exponential
    search for an upper bound, then binary search. Raises ``ValueError`` when even ``u = 0``
    does not fit (the length is too small to hold the needle and the question): ``"{what} {smallest} already
    takes N tokens"``.
    """
    base = count(0)
    if base > length:
        raise ValueError(
            f"length {length} is too small: {what} {smallest} already takes {base} tokens"
        )
    lo, hi = 0, 1  # count(lo) fits; hi is unknown
    while True:
        if max_units is not None and hi >= max_units:
            if count(max_units) <= length:
                return max_units
            hi = max_units
            break
        if count(hi) > length:
            break
        lo, hi = hi, hi * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if count(mid) <= length:
            lo = mid
        else:
            hi = mid
    return lo
