"""The one parser of option text: ``key=value`` pairs (typed), comma-separated names and numbers, and
list-valued options given as strings or lists (method options from the command line or Python)."""
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


def parse_names(text: str | None) -> list[str]:
    """``"none, pi,lpes"`` -> ``["none", "pi", "lpes"]`` (empty items dropped)."""
    return [x.strip() for x in (text or "").split(",") if x.strip()]


def parse_numbers(text: str, name: str) -> list[float]:
    """``"0,0.5,1"`` -> ``[0.0, 0.5, 1.0]``; a ``ValueError`` naming ``--name`` otherwise."""
    try:
        return [float(x) for x in parse_names(text)]
    except ValueError:
        raise ValueError(f"--{name} must be comma-separated numbers, got {text!r}") from None


def as_list(value, cast=float, name: str = "option") -> list | None:
    """None -> None; a number -> [number]; "1,2" / "1 2" / [1, 2] -> list (options given as CLI strings)."""
    if value is None:
        return None
    if isinstance(value, str):
        value = [x for x in value.replace(",", " ").split() if x]
    elif not isinstance(value, (list, tuple)):
        value = [value]
    try:
        return [cast(v) for v in value]
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a list of numbers, got {value!r}") from None


def check_int(name: str, value: Any, *, minimum: int = 1, maximum: int | None = None) -> int:
    """Validate an integer option (bools, strings and floats with a fraction are rejected)."""
    import numbers

    if (isinstance(value, bool) or not isinstance(value, numbers.Real) or value != value
            or value in (float("inf"), float("-inf")) or int(value) != value):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    value = int(value)
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    if maximum is not None and value > maximum:
        raise ValueError(f"{name} must be <= {maximum}, got {value}")
    return value


def refuse_unknown(given, known, what: str) -> None:
    """A :class:`ValueError` naming every name of ``given`` that is not in ``known`` (``what``: "model
    option", ...), the closest known name for each, and the known ones; nothing when all are known."""
    import difflib

    unknown = sorted(set(given) - set(known))
    if not unknown:
        return
    guesses = [f"{name} -> {close[0]}?" for name in unknown
               if (close := difflib.get_close_matches(name, sorted(known), n=1))]
    hint = f" (did you mean: {', '.join(guesses)})" if guesses else ""
    raise ValueError(f"unknown {what}(s) {', '.join(unknown)}{hint}; known: {', '.join(sorted(known))}")
