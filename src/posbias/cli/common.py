"""Helpers shared by the CLI modules: friendly errors, list parsing, task options."""
from __future__ import annotations

import functools
import sys
from typing import Any, Callable

import typer

from posbias.utils.options import parse_key_values  # noqa: F401  (re-exported for the CLI modules)

USER_ERRORS = (ValueError, FileNotFoundError, KeyError, RuntimeError, OSError)


def friendly_errors(fn: Callable) -> Callable:
    """Turn user errors into one red line and exit code 2 instead of a traceback
    (set POSBIAS_DEBUG=1 to see the traceback)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        import os

        try:
            return fn(*args, **kwargs)
        except USER_ERRORS as e:
            if os.environ.get("POSBIAS_DEBUG"):
                raise
            msg = e.args[0] if isinstance(e, KeyError) and e.args else e
            typer.secho(f"error: {msg}", fg="red", err=True)
            sys.exit(2)

    return wrapper


def parse_floats(text: str, name: str) -> list[float]:
    try:
        return [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"--{name} must be comma-separated numbers, got {text!r}") from None


def task_options(num_keys, num_docs, length, path, haystack, num_needles, extra) -> dict[str, Any]:
    """Collect the task flags a user set (unset flags are left to the task's defaults)."""
    opts = {"num_keys": num_keys, "num_docs": num_docs, "length": length, "path": path,
            "haystack": haystack, "num_needles": num_needles}
    opts = {k: v for k, v in opts.items() if v is not None}
    opts.update(parse_key_values(extra, "opt"))
    return opts


# Reusable typer option declarations (task flags shared by eval / search / compare).
NumKeys = typer.Option(None, "--num-keys", help="kv / kv-uuid: number of key-value pairs")
NumDocs = typer.Option(None, "--num-docs", help="mdqa: number of documents")
Length = typer.Option(None, "--length", help="passkey / niah: target prompt length in tokens")
DataPath = typer.Option(None, "--path", help="data file (kv-uuid / mdqa lost-in-the-middle .jsonl.gz)")
Haystack = typer.Option(None, "--haystack", help="niah: noise | essay | needle")
NumNeedles = typer.Option(None, "--num-needles", help="niah: number of needles (multi-key)")
ExtraOpts = typer.Option(None, "--opt", help="other task option as key=value (repeatable)")
