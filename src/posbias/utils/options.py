"""The one parser of option text: ``key=value`` pairs, comma-separated names and numbers, and
list-valued options given as strings or lists (method options from the command line or Python).

``key=value`` pairs whose target is a settings class (``--train-opt``: :class:`TrainConfig` fields,
``--model-opt``: :class:`BamConfig` arguments) are converted by that field's type
(:func:`parse_typed_options`); the others, whose targets declare no types, are read by the value's
look (:func:`parse_value`)."""
from __future__ import annotations

import difflib
import inspect
import json
import math
import numbers
import sys
import types
import typing
from typing import Any, Mapping, Optional


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


def parse_typed_options(items: Optional[list[str]], fields: Mapping[str, Any], flag: str,
                        what: str) -> dict[str, Any]:
    """``["steps=5", "probe_tasks=passkey,niah"]`` -> ``{"steps": 5, "probe_tasks": ("passkey", "niah")}``:
    each value converted by its field's type in ``fields`` (name -> type, e.g. :func:`field_types`);
    dashes in keys become underscores. A ``ValueError`` of one line for a pair without ``=``, unknown
    keys (:func:`refuse_unknown`, ``what``: "training option", ...) or a value of the wrong type."""
    pairs: dict[str, str] = {}
    for item in items or []:
        if "=" not in item:
            raise ValueError(f"--{flag} expects key=value, got {item!r}")
        key, value = item.split("=", 1)
        pairs[key.strip().replace("-", "_")] = value.strip()
    refuse_unknown(pairs, fields, what)
    return {k: convert_value(v, fields[k], f"--{flag} {k}") for k, v in pairs.items()}


def field_names(target: Any) -> list[str]:
    """The settings the class or function ``target`` takes (see :func:`field_types`)."""
    return list(field_types(target))


def field_types(target: Any) -> dict[str, Any]:
    """The settings the class or function ``target`` takes, name -> type (None where none is declared):
    the keyword arguments of a constructor (a dataclass's fields, a Hugging Face config's arguments) or
    of a function."""
    module = vars(sys.modules[target.__module__])
    params = [p for p in inspect.signature(target).parameters.values()
              if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    return {p.name: _annotation(p, module) for p in params}


def _annotation(param: inspect.Parameter, module: dict) -> Any:
    """The type of ``param`` (None: not declared, or naming what its module does not import at run time)."""
    if param.annotation is inspect.Parameter.empty:
        return None
    if not isinstance(param.annotation, str):
        return param.annotation
    try:
        return eval(param.annotation, module)  # noqa: S307 (an annotation of posbias's own source)
    except Exception:  # noqa: BLE001
        return None


_BOOLS = {"true": True, "yes": True, "1": True, "false": False, "no": False, "0": False}


def convert_value(text: str, tp: Any, name: str) -> Any:
    """``text`` as a value of type ``tp`` (bool, int, float, str, ``X | None``, ``list[X]``, ``tuple[X, ...]``,
    ``dict`` as JSON; no type: :func:`parse_value`); a ``ValueError`` naming ``name`` otherwise.
    ``none`` / ``null`` is None where the type allows it; lists are comma-separated."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        if text.lower() in ("none", "null") and type(None) in args:
            return None
        kinds = [a for a in args if a is not type(None)]
        return convert_value(text, kinds[0], name) if len(kinds) == 1 else parse_value(text)
    if tp is bool:
        if text.lower() not in _BOOLS:
            raise ValueError(f"{name} must be true or false, got {text!r}")
        return _BOOLS[text.lower()]
    if tp in (int, float):
        try:
            return tp(text)
        except ValueError:
            raise ValueError(f"{name} must be {'an integer' if tp is int else 'a number'}, got {text!r}") from None
    if tp is str:
        return text
    if origin in (list, tuple) or tp in (list, tuple):
        return _convert_sequence(text, origin or tp, args, name)
    if origin is dict or tp is dict:
        try:
            value = json.loads(text)
        except ValueError:
            value = None
        if not isinstance(value, dict):
            raise ValueError(f"{name} must be a JSON object, got {text!r}")
        return value
    return parse_value(text)


def check_shape(value: Any, tp: Any, name: str) -> Any:
    """A value read from a settings file (JSON, TOML or YAML: already typed) checked against its field's type
    ``tp`` (bool, int, float, str, ``X | None``, ``list[X]``, ``tuple[X, ...]``, ``dict``; anything else as
    it is); returns it (a float field's integer as a float); a one-line ``ValueError`` naming ``name``."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp is None or tp is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        first = None
        for kind in (a for a in args if a is not type(None)):
            try:
                return check_shape(value, kind, name)
            except ValueError as e:
                first = first or e
        raise first or ValueError(f"{name} has the wrong type ({value!r})")
    checks = {bool: lambda v: isinstance(v, bool), str: lambda v: isinstance(v, str),
              int: lambda v: isinstance(v, int) and not isinstance(v, bool),
              float: lambda v: isinstance(v, (int, float)) and not isinstance(v, bool)}
    if tp in checks:
        if not checks[tp](value):
            raise ValueError(f"{name} must be {_KIND_NAMES[tp]}, got {value!r}")
        return float(value) if tp is float else value
    if origin in (list, tuple) or tp in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise ValueError(f"{name} must be a list, got {value!r}")
        item = args[0] if args and (len(args) == 1 or args[-1] is Ellipsis) else None
        return type(value)(check_shape(v, item, name) for v in value) if item is not None else value
    if origin is dict or tp is dict:
        if not isinstance(value, dict):
            raise ValueError(f"{name} must be a table of key: value pairs, got {value!r}")
    return value


_KIND_NAMES = {bool: "true or false", str: "text", int: "an integer", float: "a number"}


def _convert_sequence(text: str, kind: type, args: tuple, name: str) -> list | tuple:
    """A comma-separated list (``list[X]``, ``tuple[X, ...]``) or fixed tuple (``tuple[X, Y]``)."""
    items = [x.strip() for x in text.split(",") if x.strip()]
    if kind is tuple and args and args[-1] is not Ellipsis:
        if len(items) != len(args):
            raise ValueError(f"{name} takes {len(args)} comma-separated values, got {text!r}")
        return tuple(convert_value(x, a, name) for x, a in zip(items, args, strict=True))
    item_type = args[0] if args else None
    values = [convert_value(x, item_type, name) for x in items]
    return tuple(values) if kind is tuple else values


def parse_value(text: str) -> Any:
    """One option value whose target declares no type: bool, list of numbers, int, float or string (in
    that order of preference)."""
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    if "," in text:
        try:
            return [float(x) for x in text.split(",") if x.strip()]
        except ValueError:
            return text
    for cast in (int, float):
        try:
            value = cast(text)
        except ValueError:
            continue
        if isinstance(value, int) and abs(value) > MAX_INT_OPTION:
            raise ValueError(f"{text[:12]}... ({len(text)} digits) is too large for an option value")
        return value
    return text


MAX_INT_OPTION = 2 ** 63  # an integer option beyond this cannot be a count, a seed or a float factor


def parse_names(text: str | None) -> list[str]:
    """``"none, pi,lpes"`` -> ``["none", "pi", "lpes"]`` (empty items dropped)."""
    return [x.strip() for x in (text or "").split(",") if x.strip()]


def parse_numbers(text: str, name: str) -> list[float]:
    """``"0,0.5,1"`` -> ``[0.0, 0.5, 1.0]``; a ``ValueError`` naming ``--name`` otherwise."""
    try:
        return [float(x) for x in parse_names(text)]
    except ValueError:
        raise ValueError(f"--{name} must be comma-separated numbers, got {text!r}") from None


def parse_depths(text: str, name: str = "depths") -> list[float]:
    """Gold depths: ``"0,0.5,1"``, or ``"every:N"`` for ``N`` evenly spaced depths ``i / (N - 1)`` (rounded
    to 4 decimals): with ``N`` items, every item position once (``every:20`` for 20 documents)."""
    spec = str(text).strip().lower()
    if not spec.startswith("every:"):
        return parse_numbers(text, name)
    count = spec.split(":", 1)[1].strip()
    if not count.isdigit() or not 2 <= int(count) <= 1000:
        raise ValueError(f"--{name} every:N needs a whole number N from 2 to 1000, got {text!r}")
    return [round(i / (int(count) - 1), 4) for i in range(int(count))]


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

    if (isinstance(value, bool) or not isinstance(value, numbers.Real) or value != value
            or value in (float("inf"), float("-inf")) or int(value) != value):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    value = int(value)
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    if maximum is not None and value > maximum:
        shown = str(value) if value < 10 ** 20 else f"a number of {len(str(value))} digits"
        raise ValueError(f"{name} must be <= {maximum}, got {shown}")
    return value


def check_number(name: str, value: Any, *, above: float | None = None, at_least: float | None = None) -> float:
    """A finite float (``> above`` / ``>= at_least`` when given); a ``ValueError`` naming ``name`` otherwise (NaN,
    infinity, text, a number too large for a float)."""
    try:
        number = float(value)
    except (TypeError, ValueError, OverflowError):
        raise ValueError(f"{name} must be a number, got {value!r}") from None
    if isinstance(value, bool) or not math.isfinite(number):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    if above is not None and not number > above:
        raise ValueError(f"{name} must be > {above:g}, got {number:g}")
    if at_least is not None and not number >= at_least:
        raise ValueError(f"{name} must be >= {at_least:g}, got {number:g}")
    return number


def refuse_unknown(given, known, what: str) -> None:
    """A :class:`ValueError` naming every name of ``given`` that is not in ``known`` (``what``: "model
    option", ...), the closest known name for each, and the known ones; nothing when all are known."""

    unknown = sorted(set(given) - set(known))
    if not unknown:
        return
    guesses = [f"{name} -> {close[0]}?" for name in unknown
               if (close := difflib.get_close_matches(name, sorted(known), n=1))]
    hint = f" (did you mean: {', '.join(guesses)})" if guesses else ""
    raise ValueError(f"unknown {what}(s) {', '.join(unknown)}{hint}; known: {', '.join(sorted(known))}")
