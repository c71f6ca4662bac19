"""Run folders: one kind of run per folder, nothing foreign overwritten, settings recorded truly.

Every command that writes into ``--out`` goes through :func:`open_run`, which only *reads*:

* an empty (or missing) folder is a fresh run; the temporaries of killed atomic writes
  (``.name.XXXX.tmp``, :func:`posbias.utils.io.atomic_write_bytes`) do not count, other files do,
  dotfiles too (a home folder of dotfiles is not empty);
* a folder holding a ``config.json`` of the same kind of run is a resume, provided the settings
  under ``check_keys`` are equal (otherwise a ``ValueError`` lists only the values that differ);
* anything else is refused, saying what was found: another kind of run, a Hugging Face model, a
  ``config.json`` that is not valid JSON, or files without any run config.

The returned :class:`RunFolder` writes ``config.json`` (``kind``, settings, library versions,
the git commit of the posbias checkout (:func:`git_commit`), command line) only when :meth:`RunFolder.commit` is
called, which a run does just before it
writes its first result; a run rejected while validating its input therefore leaves nothing
behind and never claims the folder. A folder that a run opens (existing) or commits (new) is held by
that process until it ends (:mod:`posbias.utils.folder_lock`): a second command pointed at it while the
first still runs is refused with one line. ``commit`` checks the folder again once it holds it, so two
runs started together on a new ``--out`` cannot mix: the later one resumes the earlier one's run when
the settings agree and is refused otherwise. On a resume ``commit`` records this invocation's settings,
the ones the run's summary then describes; every committed invocation is also appended to
``invocations.jsonl`` (time, command line, settings), the record of a folder that several
invocations filled (e.g. a study evaluated one scheme per invocation).

``posbias apply`` writes a model folder instead: its kind is recognised by ``posbias_adapter.json`` (or,
in folders of older versions, the Hugging Face ``config.json`` next to ``posbias_factors.json``), and it
never commits a posbias config.
"""
from __future__ import annotations

import functools
import json
import re
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Optional

from posbias.utils.folder_lock import hold
from posbias.utils.io import append_jsonl, atomic_write_json, json_default, read_json, versions

CONFIG = "config.json"
INVOCATIONS = "invocations.jsonl"
KINDS = ("eval", "compare", "search", "analyze", "apply", "train", "study", "tune", "train-moice", "ability",
         "positional-dims", "map", "attention-bias")
# Configs written before ``kind`` was recorded: the key that only that kind's settings have.
_LEGACY_MARKERS = (("search", "ga"), ("compare", "methods"), ("study", "schemes"), ("train", "pe"),
                   ("analyze", "controls"), ("eval", "method"))
# Settings that say what content a run used (posbias.models.fingerprint.model_content): compared on every resume
# where both the folder and the new run recorded them, whatever the command's own resume keys.
CONTENT_KEYS = ("model_content",)
_APPLY_MARKER = "posbias_factors.json"  # posbias.patching.rope_scaling.SAVED_FACTORS_NAME
_ADAPTER_MARKER = "posbias_adapter.json"  # posbias.models.adapter.ADAPTER_FILE


@dataclass
class RunFolder:
    """A checked run folder; ``resuming`` when it already holds a run of this kind."""

    path: Path
    kind: str
    config: dict
    resuming: bool = False
    parent: Optional["RunFolder"] = None
    check_keys: tuple[str, ...] = ()
    upgrade: Optional[Callable[[dict], dict]] = None
    _committed: bool = field(default=False, repr=False)

    def commit(self) -> Path:
        """Write ``config.json`` and append to ``invocations.jsonl`` (once; the parent run's first)
        and return the folder. The folder is checked again once this process holds it: a run that
        another command wrote there since :func:`open_run` looked (two runs started together on a
        new ``--out``) is resumed if it has these settings and refused otherwise."""
        if not self._committed:
            if self.parent is not None:
                self.parent.commit()
            self.path.mkdir(parents=True, exist_ok=True)
            hold(self.path)
            self.resuming = _check_folder(self.path, self.kind, self.config, self.check_keys, self.upgrade)
            remove_temporaries(self.path)
            record = {"kind": self.kind, "config": self.config, "versions": versions(), "git": git_commit(),
                      "argv": sys.argv}
            atomic_write_json(self.path / CONFIG, record)
            append_jsonl(self.path / INVOCATIONS, {"time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                                                   "resumed": self.resuming, **record})
            self._committed = True
        return self.path


def announce_resume(done: int, total: int, what: str, out: Path) -> None:
    """One line on stderr: a run that continues an earlier one says how much of it was done
    (``resuming 120 of 250 instances already in runs/x``)."""
    print(f"resuming {done} of {total} {what} already in {out}", file=sys.stderr)


def safe_name(label: str) -> str:
    """A user-supplied name (a method label, a variant naming a file: ``lpes@factors=../a.json``) as one
    file or folder name inside a run folder: every character other than letters, digits and
    ``. _ = @ + -`` written as ``_``, and a leading dot as ``_`` too, so the name never climbs out
    (``..``), hides (``.x``) or is empty. The one place such names become paths."""
    name = re.sub(r"[^A-Za-z0-9._=@+-]", "_", str(label))
    return "_" + name[1:] if name.startswith(".") else (name or "_")


@functools.lru_cache(maxsize=1)
def git_commit() -> str:
    """The commit of the git checkout this posbias runs from (``git rev-parse HEAD``), with ``+dirty``
    when tracked files differ from it, or ``"not a git checkout"`` (an installed package, no git).
    Recorded in every run's ``config.json`` beside the settings; not part of the resume check."""
    package = Path(__file__).resolve().parents[1]

    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(package), *args], capture_output=True, text=True, check=True,
                              timeout=10).stdout.strip()

    try:
        git("ls-files", "--error-unmatch", "__init__.py")  # the package is tracked by this checkout
        head = git("rev-parse", "HEAD")
        dirty = git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.SubprocessError):
        return "not a git checkout"
    return head + ("+dirty" if dirty else "")


def out_path(out: str | Path, flag: str = "--out") -> Path:
    """``Path(out)``, refusing an empty value (``Path("")`` would be the current directory)."""
    if not str(out).strip():
        raise ValueError(f"{flag} is empty: give the folder the run writes into")
    return Path(out).expanduser()


def open_run(out: str | Path, kind: str, config: dict, *, check_keys: Iterable[str] = (),
             parent: RunFolder | None = None, upgrade: Callable[[dict], dict] | None = None) -> RunFolder:
    """Check that ``out`` may hold a ``kind`` run with ``config``; writes nothing (see the module doc).
    ``upgrade`` turns the settings an older posbias recorded into today's form before they are compared
    (e.g. a comma-separated string that is a list now)."""
    if kind not in KINDS:
        raise ValueError(f"unknown run kind {kind!r}; known: {', '.join(KINDS)}")
    path = out_path(out)
    check_keys = tuple(check_keys)
    if path.is_dir():  # an existing folder is claimed now (and checked again once held); a new one when committed
        _check_folder(path, kind, config, check_keys, upgrade)
        hold(path)
    resuming = _check_folder(path, kind, config, check_keys, upgrade)
    return RunFolder(path, kind, config, resuming=resuming, parent=parent, check_keys=check_keys, upgrade=upgrade)


def _check_folder(path: Path, kind: str, config: dict, check_keys: tuple[str, ...],
                  upgrade: Callable[[dict], dict] | None = None) -> bool:
    """Whether ``path`` holds a ``kind`` run that a run with ``config`` resumes (False: missing or
    empty); a ``ValueError`` for another kind of run, other settings under ``check_keys`` or a folder
    that holds no run."""
    found = folder_kind(path)
    if found not in (None, kind):
        raise ValueError(f"{path} holds {_describe(found)}, not {_describe(kind)}; use another --out")
    if found is None:
        return False
    if kind != "apply":
        old = read_run_settings(path, required=bool(check_keys))
        if upgrade is not None:
            old = upgrade(old)
        missing = [k for k in check_keys if k not in old]
        if check_keys and len(missing) > len(check_keys) / 2:  # e.g. {"seed": 0}: it would match any run
            raise ValueError(f"{path / CONFIG} records too few of the {kind} run's settings (no "
                             f"{', '.join(missing[:4])}{', ...' if len(missing) > 4 else ''}): not a folder posbias "
                             "can resume; use another --out")
        changed = [k for k in CONTENT_KEYS if k in old and k in config and old[k] != config[k]]
        if changed:
            raise ValueError(f"{path} holds a run of {old.get('model', 'a model')} whose content has changed since "
                             f"(its weights, files or commit): resuming would mix two models' results; use another "
                             f"--out")
        diff = settings_diff(old, _roundtrip(config), check_keys)
        if diff:
            raise ValueError(f"{path} holds a run with other settings ({'; '.join(diff)}); "
                             f"rerun with its settings to resume, or use another --out{_auto_dtype_hint(old, config)}")
    return True


def prepare_run_dir(out: str | Path, config: dict, *, kind: str, check_keys: Iterable[str] = ()) -> Path:
    """Check ``out`` for a ``kind`` run with ``config`` and write its ``config.json`` now: shorthand
    for ``open_run(...).commit()``, for runs that have nothing left to validate."""
    return open_run(out, kind, config, check_keys=check_keys).commit()


def folder_kind(path: Path) -> str | None:
    """The kind of run in ``path`` (None: missing or empty); ``ValueError`` for anything else."""
    if not path.exists():
        return None
    if not path.is_dir():
        raise ValueError(f"{path} is a file, not a folder; give --out a folder")
    entries = sorted(p.name for p in path.iterdir() if not is_temporary(p.name))
    if not entries:
        return None
    if _ADAPTER_MARKER in entries:
        return "apply"
    if CONFIG not in entries:
        shown = ", ".join(entries[:3]) + (f", ... ({len(entries)} entries)" if len(entries) > 3 else "")
        raise ValueError(f"{path} is not empty ({shown}) and holds no posbias run ({CONFIG}); "
                         "use a new or empty --out")
    doc = _read_config(path)
    if "model_type" in doc:
        if (path / _APPLY_MARKER).exists():
            return "apply"
        raise ValueError(f"{path} holds a Hugging Face model ({CONFIG} with model_type "
                         f"{doc['model_type']!r}); use another --out")
    kind = doc.get("kind") or _legacy_kind(doc)
    if kind not in KINDS:
        raise ValueError(f"{path / CONFIG} is not the config of a posbias run; use another --out")
    return kind


def is_temporary(name: str) -> bool:
    """Whether a file name is the temporary of an atomic write (``.name.XXXX.tmp``)."""
    return name.startswith(".") and name.endswith(".tmp")


def remove_temporaries(folder: Path) -> int:
    """Delete the temporaries that killed atomic writes left anywhere below ``folder`` (a folder this
    process holds: no write of another command is under way there); returns how many."""
    stale = [p for p in folder.rglob(".*.tmp") if p.is_file()]
    for p in stale:
        p.unlink(missing_ok=True)
    return len(stale)


def _auto_dtype_hint(old: dict, new: dict) -> str:
    """What to say when ``--dtype auto`` resolves to another dtype than the folder's run did (``auto`` picks
    bfloat16 on a CPU with native bfloat16 since this posbias; a folder begun in float32 resumes with
    ``--dtype float32``)."""
    was, now = old.get("dtype"), new.get("dtype")
    if was == now or (new.get("load") or {}).get("dtype") != "auto" or not was:
        return ""
    return f" (--dtype auto gives {now} here; --dtype {was} resumes this folder)"


def settings_diff(old: dict, new: dict, keys: Iterable[str]) -> list[str]:
    """``"key: old -> new"`` for each of ``keys`` recorded in ``old`` whose value differs; nested
    settings (dicts in both) name only the inner values that differ (``ga.population: 6 -> 3``)."""
    out: list[str] = []
    for k in keys:
        if k in old:
            _diff(k, old[k], new.get(k), out)
    return out


def _diff(name: str, a: Any, b: Any, out: list[str]) -> None:
    if isinstance(a, dict) and isinstance(b, dict):
        for k in list(a) + [k for k in b if k not in a]:
            _diff(f"{name}.{k}", a.get(k), b.get(k), out)
    elif a != b:
        out.append(f"{name}: {_shown(a)} -> {_shown(b)}")


def _shown(value: Any) -> str:
    """``repr``, but a float that needs more than 6 significant digits is cut to 6 (``0.0883883``
    rather than ``0.08838834764831845``; ``10000.0`` stays as it is)."""
    if isinstance(value, float) and float(f"{value:.6g}") != value:
        return f"{value:.6g}"
    return repr(value)


def read_run_settings(path: Path, *, required: bool = True) -> dict:
    """The settings (``"config"``) that the run in folder ``path`` recorded; a ``ValueError`` naming the
    file when they are missing or not an object, or (``required``) empty: such a file would match any
    settings and mix other runs' results into the folder."""
    settings = _read_config(path).get("config")
    if not isinstance(settings, dict) or (required and not settings):
        raise ValueError(f"{path / CONFIG} records no settings of its run (\"config\" is "
                         f"{json.dumps(settings)[:40] if settings is not None else 'missing'}); "
                         "fix or delete it, or use another --out")
    return settings


def _read_config(path: Path) -> dict:
    try:
        doc = read_json(path / CONFIG)
    except ValueError as e:
        raise ValueError(f"{e}; fix or delete it, or use another --out") from None
    if not isinstance(doc, dict):
        raise ValueError(f"{path / CONFIG} is not the config of a posbias run; use another --out")
    return doc


def _legacy_kind(doc: dict) -> str | None:
    cfg = doc.get("config")
    if not isinstance(cfg, dict) or "versions" not in doc:
        return None
    return next((kind for kind, key in _LEGACY_MARKERS if key in cfg), None)


def _describe(kind: str) -> str:
    if kind == "apply":
        return f"a model written by posbias apply ({_ADAPTER_MARKER}, or {CONFIG} with model_type and {_APPLY_MARKER})"
    return f"{'an' if kind[0] in 'aeiou' else 'a'} {kind} run ({CONFIG})"


def _roundtrip(v: Any) -> Any:
    """``v`` as it reads back from JSON (tuples become lists, paths strings)."""
    return json.loads(json.dumps(v, default=json_default))
