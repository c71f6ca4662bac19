"""Settings files that ship with posbias: named protocols a command reads with ``--config NAME``.

``protocols/<command>/<name>.toml`` holds the settings of one command's config object (the same keys
as any ``--config`` file, see :mod:`posbias.cli.config_file`); ``posbias study --config quick`` reads
``protocols/study/quick.toml`` when no file called ``quick`` exists. Flags given beside it override it.
"""
from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).parent
SUFFIX = ".toml"


def protocol_names(command: str) -> list[str]:
    """The packaged protocols of ``command`` (``"study"`` -> ``["quick"]``), sorted."""
    folder = ROOT / command
    return sorted(p.stem for p in folder.glob(f"*{SUFFIX}")) if folder.is_dir() else []


def protocol_path(command: str, name: str) -> Path | None:
    """The file of the packaged protocol ``name`` of ``command``; None when there is none."""
    if not name or Path(name).name != name or name.startswith("."):
        return None
    path = ROOT / command / f"{name}{SUFFIX}"
    return path if path.is_file() else None
