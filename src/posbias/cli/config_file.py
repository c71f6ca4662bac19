"""``--config FILE``: a command's settings from a JSON, TOML or YAML file, under the flags the user gave.

The file holds the settings of the command's config object (:class:`posbias.training.TrainConfig`,
:class:`posbias.study.config.StudyConfig`, :class:`posbias.search.config.SearchConfig`,
:class:`posbias.evaluation.session.EvalConfig`, ...; for the commands without one, the settings their
run folder records), by field name, as a run records them: a run folder's ``config.json`` (``{"kind": ...,
"config": {...}}``) is read as its ``config``, so any run can be repeated or resumed with
``--config <run>/config.json``. A flag given on the command line overrides the file's value (for
options that hold ``key=value`` pairs, each given key overrides that key); a setting the file does
not name keeps the flag's default. An unknown key, or a run config of another command, is one line
naming it. YAML is read when PyYAML is installed.
"""
from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any, Iterable, Mapping

import typer

from posbias.protocols import protocol_names, protocol_path
from posbias.utils.io import read_text
from posbias.utils.options import check_shape, refuse_unknown

CONFIG_HELP = ("settings file (JSON, TOML or YAML; a run folder's config.json too): its values apply where no "
               "flag is given, flags override them")


# What every run folder's config.json records beside the settings (the commit, the resolved model
# path, how the model was loaded, an adapter's method): read back, they are derived, not settings.
RECORDED_KEYS = ("git", "model_path", "load", "dtype", "adapter", "model_content")


def ConfigFileOption(kind: str | None = None):
    """The ``--config`` option of the commands that take a settings file; its help names the protocols
    that ship for the command ``kind`` (:mod:`posbias.protocols`)."""
    names = protocol_names(kind) if kind else []
    shipped = f"; or a protocol that ships with posbias: {', '.join(names)}" if names else ""
    return typer.Option(None, "--config", help=CONFIG_HELP + shipped)


def read_settings_file(path: str | Path, kind: str | None) -> dict[str, Any]:
    """The settings in ``path`` (by suffix: ``.toml``, ``.yaml`` / ``.yml``, else JSON); a run
    folder's ``config.json`` gives its ``config`` after checking that it is a ``kind`` run (any kind
    for None). A name that is no file but a packaged protocol of ``kind`` (:mod:`posbias.protocols`,
    e.g. ``posbias study --config quick``) reads that protocol."""
    doc = read_settings_doc(settings_path(path, kind))
    if is_run_config(doc):
        if kind is not None and doc["kind"] != kind:
            raise ValueError(f"--config {path} is the config of a {doc['kind']} run; posbias {kind} needs "
                             f"the settings of a {kind} run")
        doc = doc["config"]
    return doc


def settings_path(path: str | Path, kind: str | None) -> Path:
    """``path`` as given, or the packaged protocol of ``kind`` it names when no such file exists; a
    name that is neither is a ``ValueError`` listing the packaged protocols."""
    path = Path(path).expanduser()
    if path.exists() or kind is None:
        return path
    packaged = protocol_path(kind, str(path))
    if packaged is not None:
        return packaged
    names = protocol_names(kind)
    if names and not path.suffix and path.name == str(path):
        raise ValueError(f"--config {path}: no such file, and posbias {kind} ships no protocol of that name "
                         f"(its protocols: {', '.join(names)})")
    return path


def is_run_config(doc: dict) -> bool:
    """Whether a settings document is a run folder's ``config.json`` (its settings under ``config``)."""
    return isinstance(doc.get("config"), dict) and isinstance(doc.get("kind"), str)


def read_settings_doc(path: str | Path) -> dict[str, Any]:
    """The parsed settings file as it is (a run folder's ``config.json`` not unwrapped)."""
    path = Path(path).expanduser()
    text = read_text(path)
    suffix = path.suffix.lower()
    try:
        if suffix == ".toml":
            doc = tomllib.loads(text)
        elif suffix in (".yaml", ".yml"):
            doc = _load_yaml(text, path)
        else:
            doc = json.loads(text)
    except (ValueError, tomllib.TOMLDecodeError) as e:  # json.JSONDecodeError is a ValueError
        raise ValueError(f"--config {path}: not valid {_format(suffix)} ({e})") from None
    if not isinstance(doc, dict):
        raise ValueError(f"--config {path}: expected settings as key: value pairs, got {type(doc).__name__}")
    return doc


def settings_with_file(ctx: typer.Context | None, path: str | Path | None, kind: str, flags: Mapping[str, Any],
                       known: Iterable[str], *, fields_of: Mapping[str, str] | None = None,
                       ignore: Iterable[str] = ()) -> dict[str, Any]:
    """``flags`` (settings built from the command line, by field name) with the file's values where the
    user gave no flag: the parameters of the command ``ctx`` given on the command line (``fields_of`` names the
    field a parameter sets when their names differ) keep their values; dict-valued settings are merged
    key by key (given keys win). ``ignore``: keys a run folder records beside the settings (derived
    ones); any other key not in ``known`` is refused, and where ``known`` maps names to types
    (:func:`~posbias.utils.options.field_types`) a value of another type is refused in one line naming the file
    and the key. Without ``path``: ``flags`` unchanged; without ``ctx`` (a Python call) every setting in
    ``flags`` counts as given."""
    settings = dict(flags)
    if not path:
        return settings
    skip = {*ignore, *RECORDED_KEYS}
    values = {k: v for k, v in read_settings_file(path, kind).items() if k not in skip}
    try:
        refuse_unknown(values, known, f"{kind} setting")
    except ValueError as e:
        raise ValueError(f"--config {path}: {e}") from None
    if isinstance(known, Mapping):
        values = {k: check_shape(v, known[k], f"--config {path}: {k}") for k, v in values.items()}
    names = given_parameters(ctx)
    given = set(settings) if names is None else {(fields_of or {}).get(name, name) for name in names}
    for key, value in values.items():
        if isinstance(value, dict) and isinstance(settings.get(key), dict):
            settings[key] = {**value, **settings[key]}
        elif key not in given:
            settings[key] = value
    return settings


def file_out(path: str | Path | None) -> str | None:
    """The run folder (``out``) that the settings file ``path`` names; None without a file, without
    ``out`` or when it cannot be read (the command has said why)."""
    if not path:
        return None
    try:
        out = read_settings_file(path, None).get("out")
    except (ValueError, OSError):
        return None
    return out if isinstance(out, str) else None


def require(settings: Mapping[str, Any], key: str, flag: str) -> Any:
    """``settings[key]``, or a one-line ``ValueError`` saying that ``flag`` (or the file's ``key``) is needed."""
    if settings.get(key) is None:
        raise ValueError(f"missing {flag}: give it on the command line or as {key!r} in the --config file")
    return settings[key]


def given_parameters(ctx: typer.Context | None) -> set[str] | None:
    """The parameters of the command ``ctx`` that the user gave (on the command line or in the
    environment, not defaults); None without a command."""
    if ctx is None:
        return None
    return {name for name in ctx.params
            if getattr(ctx.get_parameter_source(name), "name", None) in ("COMMANDLINE", "ENVIRONMENT")}


def _load_yaml(text: str, path: Path) -> Any:
    try:
        import yaml  # optional: PyYAML is not a dependency of posbias
    except ImportError:
        raise ValueError(f"--config {path}: reading YAML needs PyYAML (pip install pyyaml); "
                         "or give the settings as JSON or TOML") from None
    class NoAliases(yaml.SafeLoader):
        """YAML without aliases: settings never need them, and an alias bomb (aliases of aliases) expands
        without end once the settings are walked."""

        def compose_node(self, parent, index):
            if self.check_event(yaml.AliasEvent):
                raise yaml.YAMLError("aliases (*name) are not read in a settings file")
            return super().compose_node(parent, index)

    try:
        return yaml.load(text, Loader=NoAliases)  # noqa: S506 (a SafeLoader subclass)
    except yaml.YAMLError as e:
        raise ValueError(f"--config {path}: not valid YAML ({' '.join(str(e).split())})") from None


def _format(suffix: str) -> str:
    return {".toml": "TOML", ".yaml": "YAML", ".yml": "YAML"}.get(suffix, "JSON")
