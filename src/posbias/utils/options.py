"""``key=value`` options from the command line, typed."""
from __future__ import annotations

from typing import Any, Optional


def parse_key_values(items: Optional[list[str]], flag: str = "opt") -> dict[str, Any]:
    """``["factor=1.5", "bases=10000,13000", "order=index"]`` -> ``{"factor": 1.5, "bases": [10000.0,
    13000.0], "order": "index"}``; dashes in keys become underscores.

    Values are parsed as a bool (true/false), a comma-separated list of numbers, an int, a float,
    or kept as a string. A pair without ``=`` is a ``ValueError`` naming ``--flag``.
    """
    out: dict[str, Any] = {}
    for item in items or []:
        if "=" not in item:
            raise ValueError(f"--{flag} expects key=value, got {item!r}")
        key, value = item.split("=", 1)
        out[key.strip().replace("-", "_")] = parse_value(value.strip())
    return out


def parse_value(text: str) -> Any:
    """One option value: bool, list of numbers, int, float or string (in that order of preference)."""
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    if "," in text:
        try:
            return [float(x) for x in text.split(",") if x.strip()]
        except ValueError:
            return text
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return text
