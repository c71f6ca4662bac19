"""Atomic writes, append-only jsonl logs and readers that name the file they fail on.

Every run writes ``config.json`` (arguments + versions) and its results into its own folder (see
:mod:`posbias.utils.run_folder`, which decides whether a folder may be written to).
Files are replaced atomically (write to a temp file, then ``os.replace``) so a killed run never
leaves a half-written file; jsonl logs are appended one flushed line at a time, and a torn last
line (from a kill mid-write) is ignored on reading.
"""
from __future__ import annotations

import dataclasses
import gzip
import json
import os
import platform
import sys
import tempfile
import zlib
from importlib.metadata import version
from pathlib import Path
from typing import Any, Iterator


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
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=False, default=json_default) + "\n")


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


def json_default(o: Any) -> Any:
    if isinstance(o, Path):
        return str(o)
    if hasattr(o, "tolist"):
        return o.tolist()
    if hasattr(o, "__dataclass_fields__"):

        return dataclasses.asdict(o)
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


def append_jsonl(path: str | Path, record: dict) -> None:
    """Append one JSON line and flush it to disk.

    Every line this writes ends with a newline, so a file whose last line does not is either torn (a
    kill mid-write: not valid JSON, cut off first so the new record never lands on it; :func:`read_jsonl`
    skips such a line) or complete without its newline (written by hand or another tool: kept, and
    the newline added). No record a reader has seen is lost.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    line = (json.dumps(record, default=json_default) + "\n").encode("utf-8")
    with open(path, "a+b") as f:
        size = f.seek(0, os.SEEK_END)
        if size:
            f.seek(size - 1)
            if f.read(1) != b"\n":
                f.seek(0)
                data = f.read()
                start = data.rfind(b"\n") + 1
                if _is_json(data[start:]):
                    f.write(b"\n")
                else:
                    f.truncate(start)
        f.write(line)
        f.flush()
        os.fsync(f.fileno())


def _is_json(data: bytes) -> bool:
    try:
        json.loads(data.decode("utf-8"))
        return True
    except (UnicodeDecodeError, ValueError):
        return False


def read_jsonl(path: str | Path, *, strict: bool = False, key: str | None = None) -> list[dict]:
    """Read a jsonl file written by :func:`append_jsonl`.

    A torn *last* line (a kill mid-write) is skipped unless ``strict``; a malformed line anywhere
    else, a line that is not a JSON object or (with ``key``) one without the field ``key`` raises
    ``ValueError`` naming the file and line. With ``key`` a record whose ``key`` an earlier line
    already holds (a duplicated line) is counted once: the first is kept.
    """
    path = Path(path)
    if not path.exists():
        return []
    lines = read_text(path).splitlines()
    out, seen = [], set()
    for no, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rec = loads_json(line)
        except json.JSONDecodeError as e:
            if no == len(lines) and not strict:
                break
            raise ValueError(f"{path}:{no}: malformed JSON line ({e.msg})") from None
        except ValueError as e:
            raise ValueError(f"{path}:{no}: {e}") from None
        if not isinstance(rec, dict):
            raise ValueError(f"{path}:{no}: expected a JSON object, got {type(rec).__name__}")
        if key is not None:
            if key not in rec:
                raise ValueError(f"{path}:{no}: record without its {key!r} field")
            ident = json.dumps(rec[key], sort_keys=True)
            if ident in seen:
                continue
            seen.add(ident)
        out.append(rec)
    return out


MAX_JSON_DEPTH_MESSAGE = "JSON nested too deeply"


def loads_json(text: str | bytes) -> Any:
    """``json.loads``; JSON nested deeper than Python's recursion limit is a ``ValueError`` (callers
    add the file) rather than a ``RecursionError``."""
    try:
        return json.loads(text)
    except RecursionError:
        raise ValueError(MAX_JSON_DEPTH_MESSAGE) from None


def repair_jsonl(path: str | Path) -> list[dict]:
    """Read a jsonl log for resuming and drop a torn last line (a kill mid-write) from the file,
    so the next append starts on a fresh line. Returns the intact records."""
    path = Path(path)
    records = read_jsonl(path)  # every intact line (duplicates too: the lines are rewritten as they are)
    if path.exists():
        text = read_text(path)
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

            out[name] = version(name)
        except Exception:
            pass
    return out


MAX_TEXT_BYTES = 256 << 20  # a settings, factors, adapter or data file read whole: at most this many bytes


def read_text(path: str | Path, max_bytes: int = MAX_TEXT_BYTES) -> str:
    """A UTF-8 text file read whole; a ``ValueError`` naming it when it is not UTF-8, not a regular file (a
    FIFO would block, ``/dev/zero`` never ends) or larger than ``max_bytes``."""
    path = Path(path)
    if path.exists() and not path.is_file():
        raise ValueError(f"{path}: not a regular file (a folder, a pipe or a device); give a file")
    with open(path, "rb") as f:
        data = f.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise ValueError(f"{path}: larger than the {max_bytes:,} bytes posbias reads of such a file")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise ValueError(f"{path}:{line}: not UTF-8 text ({e.reason} at byte {e.start})") from None


def read_json(path: str | Path) -> Any:
    """A JSON file; malformed JSON (or text that is not UTF-8) is a ``ValueError`` naming the file."""
    path = Path(path)
    text = read_text(path)
    try:
        return loads_json(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not valid JSON ({e.msg}, line {e.lineno})") from None
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from None


MAX_LINE_CHARS = 16 * 2 ** 20  # a data line longer than this (16 Mi characters) is refused before any tokenizer sees it


def iter_jsonl_gz(path: str | Path) -> Iterator[tuple[int, dict]]:
    """Yield ``(line_number, record)`` from a ``.jsonl`` or ``.jsonl.gz`` file.

    A malformed line raises ``ValueError("<file>:<line>: ...")``; so do a line longer than
    :data:`MAX_LINE_CHARS`, JSON nested too deeply, a truncated or invalid gzip file and text that is
    not UTF-8.
    """

    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"data file not found: {path}")
    opener = gzip.open if path.suffix == ".gz" else open
    no = 0
    try:
        with opener(path, "rb") as f:
            for no, raw in enumerate(f, 1):  # decoded line by line: a bad byte is reported on its own line
                line = raw.decode("utf-8")
                if len(line) > MAX_LINE_CHARS:
                    raise ValueError(f"{path}:{no}: line of {len(line):,} characters, more than the "
                                     f"{MAX_LINE_CHARS:,} a data line may hold")
                if not line.strip():
                    continue
                try:
                    rec = loads_json(line)
                except json.JSONDecodeError as e:
                    raise ValueError(f"{path}:{no}: malformed JSON line ({e.msg})") from None
                except ValueError as e:
                    raise ValueError(f"{path}:{no}: {e}") from None
                if not isinstance(rec, dict):
                    raise ValueError(f"{path}:{no}: expected a JSON object, got {type(rec).__name__}")
                yield no, rec
    except EOFError:
        after = f", after line {no}" if no else ""
        raise ValueError(f"{path}: truncated gzip file (the compressed data ends early{after})") from None
    except (gzip.BadGzipFile, zlib.error) as e:
        raise ValueError(f"{path}: not a valid gzip file ({e})") from None
    except UnicodeDecodeError as e:
        raise ValueError(f"{path}:{no}: not UTF-8 text ({e.reason})") from None


def read_text_documents(path: str | Path, separator: str = "\f") -> list[str]:
    """The documents of a text file (``.gz``: compressed): its text split at ``separator``, with bytes
    that are not UTF-8 replaced. Read in pieces, so a document longer than :data:`MAX_LINE_CHARS` (the
    limit of a data line) is refused, naming the file, before it is held whole or reaches a tokenizer."""
    path = Path(path)
    opener = gzip.open if path.name.endswith(".gz") else open
    docs: list[str] = []
    parts: list[str] = []
    size = 0
    with opener(path, "rt", encoding="utf-8", errors="replace") as f:
        while chunk := f.read(1 << 20):
            for i, piece in enumerate(chunk.split(separator)):
                if i:
                    docs.append("".join(parts))
                    parts, size = [], 0
                parts.append(piece)
                size += len(piece)
                if size > MAX_LINE_CHARS:
                    raise ValueError(f"{path}: document {len(docs) + 1} holds more than the {MAX_LINE_CHARS:,} "
                                     f"characters a document may hold; split it with form feeds ({separator!r})")
    docs.append("".join(parts))
    return docs
