"""Run folders, atomic writes and append-only jsonl logs.

Every run writes ``config.json`` (arguments + versions) and its results into its own folder.
Files are replaced atomically (write to a temp file, then ``os.replace``) so a killed run never
leaves a half-written file; jsonl logs are appended one flushed line at a time, and a torn last
line (from a kill mid-write) is ignored on reading.
"""
from __future__ import annotations

import json
import os
import platform
import sys
import tempfile
from pathlib import Path
from typing import Any, Iterable, Iterator


def _default_file_mode() -> int:
    """0o666 minus the process umask: what ``open(path, "w")`` would give (mkstemp gives 0o600)."""
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


_FILE_MODE = _default_file_mode()


def atomic_write_text(path: str | Path, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` atomically (temp file in the same folder + ``os.replace``)."""
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: str | Path, obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=False, default=_json_default) + "\n")


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, _FILE_MODE)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _json_default(o: Any) -> Any:
    if isinstance(o, Path):
        return str(o)
    if hasattr(o, "tolist"):
        return o.tolist()
    if hasattr(o, "__dataclass_fields__"):
        import dataclasses

        return dataclasses.asdict(o)
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


def append_jsonl(path: str | Path, record: dict) -> None:
    """Append one JSON line and flush it to disk."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(record, default=_json_default) + "\n")
        f.flush()
        os.fsync(f.fileno())


def read_jsonl(path: str | Path, *, strict: bool = False) -> list[dict]:
    """Read a jsonl file written by :func:`append_jsonl`.

    A torn *last* line (a kill mid-write) is skipped unless ``strict``; a malformed line anywhere
    else raises ``ValueError`` naming the file and line.
    """
    path = Path(path)
    if not path.exists():
        return []
    lines = path.read_text(encoding="utf-8").splitlines()
    out = []
    for no, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError as e:
            if no == len(lines) and not strict:
                break
            raise ValueError(f"{path}:{no}: malformed JSON line ({e.msg})") from None
    return out


def repair_jsonl(path: str | Path) -> list[dict]:
    """Read a jsonl log for resuming and drop a torn last line (a kill mid-write) from the file,
    so the next append starts on a fresh line. Returns the intact records."""
    path = Path(path)
    records = read_jsonl(path)
    if path.exists():
        text = path.read_text(encoding="utf-8")
        intact = [ln for ln in text.splitlines() if ln.strip()][: len(records)]
        expected = "".join(ln + "\n" for ln in intact)
        if text != expected:
            atomic_write_text(path, expected)
    return records


def versions() -> dict[str, str]:
    """Versions of Python, the platform and the libraries a result depends on."""
    out = {"python": sys.version.split()[0], "platform": platform.platform()}
    for name in ("posbias", "torch", "transformers", "numpy", "accelerate", "gguf"):
        try:
            from importlib.metadata import version

            out[name] = version(name)
        except Exception:
            pass
    return out


def prepare_run_dir(out: str | Path, config: dict, *, check_keys: Iterable[str] = ()) -> Path:
    """Create the run folder and write ``config.json`` (config + versions).

    When the folder already has a config (a resume), the values under ``check_keys`` must match,
    otherwise a ``ValueError`` says which differ, so results of two settings are never mixed.
    """
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    cfg_path = out / "config.json"
    if cfg_path.exists():
        old = json.loads(cfg_path.read_text())
        old_cfg = old.get("config", {})
        diff = [k for k in check_keys if k in old_cfg and old_cfg.get(k) != _roundtrip(config.get(k))]
        if diff:
            details = ", ".join(f"{k}: {old_cfg.get(k)!r} -> {config.get(k)!r}" for k in diff)
            raise ValueError(
                f"{out} holds a run with other settings ({details}); use another --out or delete it"
            )
    atomic_write_json(cfg_path, {"config": config, "versions": versions(), "argv": sys.argv})
    return out


def _roundtrip(v: Any) -> Any:
    return json.loads(json.dumps(v, default=_json_default))


def iter_jsonl_gz(path: str | Path) -> Iterator[tuple[int, dict]]:
    """Yield ``(line_number, record)`` from a ``.jsonl`` or ``.jsonl.gz`` file.

    A malformed line raises ``ValueError("<file>:<line>: ...")``.
    """
    import gzip

    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"data file not found: {path}")
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        for no, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{no}: malformed JSON line ({e.msg})") from None
            if not isinstance(rec, dict):
                raise ValueError(f"{path}:{no}: expected a JSON object, got {type(rec).__name__}")
            yield no, rec
