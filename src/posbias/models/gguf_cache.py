"""The GGUF cache: a ``.gguf`` file dequantised once and cached as a Hugging Face folder under
``$POSBIAS_CACHE/models`` (default ``~/.cache/posbias``), keyed on the file's SHA-256.

A GGUF load dequantises (~15-90 s) and cannot ``save_pretrained``, so the first load rebuilds the model from
config + state dict and caches it as safetensors; later loads take seconds.
"""
from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import sys
import warnings
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from posbias.architecture.layers import ModelLoadError
from posbias.utils.io import atomic_write_text


def cache_dir() -> Path:
    """posbias's cache folder: ``$POSBIAS_CACHE``, default ``~/.cache/posbias``."""
    return Path(os.environ.get("POSBIAS_CACHE", Path.home() / ".cache" / "posbias"))


def first_line(e: Exception) -> str:
    """The first line of an error message (its last colon dropped when more lines follow)."""
    text = str(e).strip().splitlines()
    line = text[0] if text else type(e).__name__
    return line.rstrip(":") if len(text) > 1 else line


def cached_from_gguf(gguf: Path) -> Path:
    """Dequantise a GGUF once and cache it as a safetensors HF folder; return that folder. The cache
    entry is keyed on the file's content (its SHA-256, :func:`gguf_sha256`), so another file of the
    same name and size is never taken for it."""
    sha = gguf_sha256(gguf)
    target = cache_dir() / "models" / f"{gguf.stem}-{sha[:16]}"
    created = not (target / ".complete").exists()
    if created:
        convert_gguf(gguf, target)
    _old_cache_entry(gguf, target, created=created)
    return target


_MENTIONED_OLD_ENTRIES: set[Path] = set()


def _old_cache_entry(gguf: Path, target: Path, *, created: bool) -> None:
    """The conversion of ``gguf`` cached under the name posbias gave it before the cache was keyed on
    content (``models/<stem>-<size in bytes>``), which no load reads any more: removed when this file's
    content-keyed entry ``target`` has just been created, else named once per process in one line as
    one that can be deleted (another posbias version may still read it)."""
    old = cache_dir() / "models" / f"{gguf.stem}-{gguf.stat().st_size}"
    if old == target or not (old / ".complete").is_file():
        return
    if created:
        shutil.rmtree(old, ignore_errors=True)
        shutil.rmtree(old.with_name(f"{old.name}.partial"), ignore_errors=True)
        print(f"removed {old}: the cache entry of {gguf.name} under its old name (file name and size), "
              f"replaced by {target.name}", file=sys.stderr)
    elif old not in _MENTIONED_OLD_ENTRIES:
        _MENTIONED_OLD_ENTRIES.add(old)
        print(f"{old} caches {gguf.name} under its old name (file name and size), which this posbias no longer "
              "reads: it can be deleted", file=sys.stderr)


def gguf_sha256(path: Path) -> str:
    """The SHA-256 of ``path``, hashed once per version of the file: the digest is stored in the cache
    (``models/.sha256/``) under the file's resolved path, size and modification time, and read back
    while these are unchanged."""
    stat = path.stat()
    where = hashlib.sha256(f"{path.resolve()}|{stat.st_size}|{stat.st_mtime_ns}".encode()).hexdigest()
    record = cache_dir() / "models" / ".sha256" / where
    if record.is_file():
        known = record.read_text().strip()
        if len(known) == 64:
            return known

    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(16 << 20):
            digest.update(chunk)
    atomic_write_text(record, digest.hexdigest())
    return digest.hexdigest()


def _read_gguf(gguf: Path):

    for mod, pip_name in (("gguf", "gguf"), ("accelerate", "accelerate")):
        if importlib.util.find_spec(mod) is None:
            raise ModelLoadError(f"loading a .gguf file needs the package {pip_name!r}: pip install {pip_name}")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name, trust_remote_code=False)
            src = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32,
                                                       trust_remote_code=False)
    except (ValueError, KeyError, OSError, RuntimeError, EOFError, IndexError) as e:
        raise ModelLoadError(f"cannot read the GGUF file {gguf} (truncated or corrupt?): {first_line(e)}") from None
    return src, tok


def convert_gguf(gguf: Path, target: Path) -> None:
    """Rebuild a plain model from a GGUF (GGUF-loaded models refuse save_pretrained) into ``target``."""

    src, tok = _read_gguf(gguf)
    config = src.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    fresh_cfg = AutoConfig.for_model(**config.to_dict())
    fresh = AutoModelForCausalLM.from_config(fresh_cfg, dtype=torch.float32)
    missing, unexpected = fresh.load_state_dict(src.state_dict(), strict=False)
    missing = [k for k in missing if "lm_head" not in k]
    if missing or unexpected:
        raise ModelLoadError(f"GGUF conversion of {gguf} lost weights: missing={missing[:3]} "
                             f"unexpected={unexpected[:3]}")
    if getattr(fresh_cfg, "tie_word_embeddings", False):
        fresh.tie_weights()
    tmp = target.with_name(f"{target.name}.partial-{os.getpid()}")  # two first loads at once each write their own
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        fresh.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        (tmp / ".complete").write_text(str(gguf))  # renamed with the folder: never a complete-looking half
        if not (target / ".complete").exists():
            shutil.rmtree(target, ignore_errors=True)
            try:
                os.replace(tmp, target)
            except OSError:
                if not (target / ".complete").exists():  # not another process's finished copy
                    raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
