"""The one way posbias saves a plot: a PNG written atomically (a killed run never leaves half an image)."""
from __future__ import annotations

import io
from pathlib import Path

from posbias.utils.io import atomic_write_bytes


def pyplot():
    """``matplotlib.pyplot`` on the non-interactive Agg backend."""
    import matplotlib  # noqa: PLC0415 (heavy: matplotlib on the Agg backend, only when a plot is drawn)

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415 (heavy: matplotlib on the Agg backend, only when a plot is drawn)

    return plt


def save_figure(fig, path: str | Path, *, dpi: int = 120) -> Path:
    """Save ``fig`` as a PNG at ``path`` atomically and close it; returns the path."""

    path = Path(path)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, bbox_inches="tight")
    pyplot().close(fig)
    atomic_write_bytes(path, buf.getvalue())
    return path
