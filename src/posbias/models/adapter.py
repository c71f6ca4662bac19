"""Folders written by ``posbias apply``: a base model plus a method, read back as that model with the method active.

``posbias apply`` writes what it changes, in the spirit of a PEFT adapter folder (a few KB)::

    posbias_adapter.json   {"format": "posbias-adapter", "version": 1, "method": "lpes",
                            "options": {"factors": "posbias_factors.json"},
                            "base_model": {"spec": ..., "path": ..., "revision": ...}, "merged": false, ...}
    posbias_factors.json   (lpes) the factors for the base model's layer count
    moice_routers/         (moice) the trained routers, copied in (routers.safetensors, moice_config.json)
    README.md

``--merge`` writes a standalone folder instead: the base weights and tokenizer, a ``config.json`` of model type
``posbias-scaled`` whose ``auto_map`` names ``modeling_posbias.py`` (:mod:`posbias.models.modeling_posbias`), and
the same ``posbias_adapter.json`` with ``"merged": true``. Folders written before adapters existed (a full model
copy with ``posbias_factors.json`` beside a plain ``config.json``) read as merged lpes folders.

:func:`read_adapter` recognises all three; :func:`posbias.models.load_model` loads them through :meth:`Adapter.apply`
(posbias's own implementation of the method, never the folder's modeling file), and an evaluation records the
method and its settings (:func:`eval_settings`).
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from posbias.methods import apply_method
from posbias.models.modeling_posbias import SCALING_KEY, base_config
from posbias.models.packaged import ALIASES
from posbias.patching.rope_scaling import load_factors_file
from posbias.utils.io import read_json

ADAPTER_FILE = "posbias_adapter.json"
ADAPTER_FORMAT = "posbias-adapter"
ADAPTER_VERSION = 1
FACTORS_FILE = "posbias_factors.json"  # posbias.patching.rope_scaling.SAVED_FACTORS_NAME
ROUTERS_DIR = "moice_routers"
# Methods an adapter folder can carry: those that patch the model in place; each one's options naming a file
# (or folder) stored in the folder.
ADAPTER_METHODS: dict[str, tuple[str, ...]] = {"lpes": ("factors",), "pi": (), "ms-poe": (), "moice": ("routers",)}
# The handle of the method each loaded adapter applied, keyed by the model (it lives as long as the model).
_ACTIVE: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()


class AdapterError(ValueError):
    """A ``posbias_adapter.json`` that is malformed or whose base model cannot be found."""


@dataclass(frozen=True)
class Adapter:
    """A folder written by ``posbias apply`` (``merged``: it holds the weights; ``legacy``: the old full copy)."""

    folder: Path
    method: str
    options: dict
    base_model: dict
    merged: bool = False
    legacy: bool = False

    def method_options(self) -> dict:
        """The method's options, with the files the folder stores as absolute paths."""
        files = ADAPTER_METHODS.get(self.method, ())
        return {k: (str((self.folder / v).resolve()) if k in files else v) for k, v in self.options.items()}

    def base_spec(self) -> str:
        """What to load as the base model: the recorded spec when it is an alias, else the recorded
        path when it still exists, else the spec (a Hugging Face id, or a path that moved)."""
        spec, path = self.base_model.get("spec"), self.base_model.get("path")
        if spec in ALIASES or not path:
            return str(spec)
        return str(path) if Path(path).exists() else str(spec)

    def base_hint(self) -> str:
        """The base model as a user would name it again (a merged or legacy folder always loads with the
        method active, so never the folder itself)."""
        if self.legacy:
            return "the model this folder was copied from"
        return str(self.base_model.get("spec"))

    def base_config(self):
        """The base architecture's config of a merged folder (None for a legacy folder's plain config)."""
        if not self.merged or self.legacy:
            return None
        config = read_json(self.folder / "config.json")
        self.check_merged_factors(config)
        return base_config(config)

    def check_merged_factors(self, config: dict) -> None:
        """A merged folder holds its factors twice, in ``config.json`` (what plain transformers applies through
        ``modeling_posbias.py``) and in the adapter's own settings (what posbias applies): refuse a folder
        whose two copies disagree, so the two never score different models under one name."""
        seen = (config.get(SCALING_KEY) or {}).get("factors")
        if self.method == "lpes":
            own = load_factors_file(self.folder / str(self.options["factors"]))["factors"]
        else:  # pi: one factor for every layer
            own = [self.options.get("factor", 1.0)] * len(seen or [])
        if not isinstance(seen, list) or [float(f) for f in seen] != [float(f) for f in own]:
            raise AdapterError(f"{self.folder}: the factors in config.json ({SCALING_KEY}) and the adapter's own "
                               f"({self.method}) disagree; the folder was edited by hand: write it again with "
                               "posbias apply --merge")

    def apply(self, model, tokenizer=None):
        """Apply the method to ``model`` (kept active while the model lives); returns ``(model, tokenizer)``."""

        apply_method(model, self.method, **self.method_options())
        _ACTIVE[model] = self
        return model, tokenizer

    def record(self) -> dict:
        """What a run folder records about the adapter it evaluated: the folder, its method and options
        (files as absolute paths), whether it is merged, its base model."""
        return {"folder": str(self.folder.resolve()), "method": self.method, "method_options": self.method_options(),
                "merged": self.merged, "legacy": self.legacy, "base_model": self.base_model}


def read_adapter(path: str | Path) -> Adapter | None:
    """The adapter in folder ``path``, or None when it is not a folder written by ``posbias apply``."""
    path = Path(path)
    if not path.is_dir():
        return None
    if not (path / ADAPTER_FILE).exists():
        if (path / FACTORS_FILE).exists() and (path / "config.json").exists():
            return Adapter(path, "lpes", {"factors": FACTORS_FILE}, {"spec": str(path), "path": str(path)},
                           merged=True, legacy=True)
        return None
    return _parse(path, path / ADAPTER_FILE)


def _parse(folder: Path, file: Path) -> Adapter:
    try:
        doc = read_json(file)
    except (ValueError, OSError) as e:
        raise AdapterError(f"{file}: not a readable posbias adapter file ({e})") from None
    if not isinstance(doc, dict) or doc.get("format") != ADAPTER_FORMAT:
        raise AdapterError(f"{file}: not a posbias adapter file (format {ADAPTER_FORMAT!r} expected)")
    if doc.get("version") != ADAPTER_VERSION:
        raise AdapterError(f"{file}: adapter version {doc.get('version')!r} is not {ADAPTER_VERSION}: "
                           "written by another posbias version")
    method, options, base = doc.get("method"), doc.get("options"), doc.get("base_model")
    if method not in ADAPTER_METHODS or not isinstance(options, dict) or not isinstance(base, dict):
        raise AdapterError(f"{file}: needs 'method' (one of {', '.join(ADAPTER_METHODS)}), 'options' and "
                           "'base_model'")
    inside = folder.resolve()
    outside = [options.get(k) for k in ADAPTER_METHODS[method]
               if not (folder / str(options.get(k))).resolve().is_relative_to(inside)]
    if outside:
        raise AdapterError(f"{file}: the adapter's file {outside[0]} lies outside its folder (an adapter names files "
                           "of its own folder; posbias apply writes them there)")
    missing = [options.get(k) for k in ADAPTER_METHODS[method] if not (folder / str(options.get(k))).exists()]
    if missing:
        raise AdapterError(f"{folder}: the adapter's file {missing[0]} is missing")
    return Adapter(folder, method, options, base, merged=bool(doc.get("merged")))


def active_adapter(model) -> Adapter | None:
    """The adapter :func:`posbias.models.load_model` applied to ``model`` (None for any other model)."""
    return _ACTIVE.get(model)


def adapter_record(model: str) -> dict | None:
    """What a run folder records when ``model`` is a folder written by ``posbias apply`` (None otherwise)."""
    adapter = read_adapter(Path(str(model)).expanduser())
    return None if adapter is None else adapter.record()


def eval_settings(model: str, method: str, options: dict) -> tuple[str, dict, dict | None]:
    """``(method, options, adapter record)`` an evaluation of ``model`` records: an adapter folder's own method
    and settings (the model loads with them active), or the request unchanged for any other model. A method
    asked for on top of an adapter's is refused; the folder's own method and options, as a run folder recorded
    them (a ``config.json`` re-used as ``--config``), are taken as that same request."""
    adapter = read_adapter(Path(str(model)).expanduser())
    if adapter is None:
        return method, options, None
    recorded = (method, dict(options)) == (adapter.method, adapter.method_options())
    if (method != "none" or options) and not recorded:
        raise ValueError(f"--model {model} was written by posbias apply and carries method {adapter.method}; "
                         f"evaluate it with method none, or evaluate {method} on the base model "
                         f"{adapter.base_hint()}")
    return adapter.method, adapter.method_options(), adapter.record()


def refuse_adapter(model: str, command: str, what: str) -> None:
    """One-line :class:`ValueError` when ``model`` is a folder written by ``posbias apply``: ``command``
    applies ``what`` of its own, which would replace the folder's method (or stack on it) unseen."""
    adapter = read_adapter(Path(str(model)).expanduser())
    if adapter is not None:
        raise ValueError(f"--model {model} was written by posbias apply and carries method {adapter.method}; "
                         f"{command} applies {what} of its own, which would replace or stack on "
                         f"{adapter.method} unseen: give its base model {adapter.base_hint()}")
