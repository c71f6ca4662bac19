"""What a model *is*, cheaply: the content identity a run folder records beside the model's name.

A resumed run must not mix two models' records. A name or path says nothing about what is behind it now: a
model folder overwritten in place, an ``apply`` folder re-applied with other factors, a training run continued
to a later step, a Hub id whose ``main`` moved. :func:`model_content` returns a string that changes with the
content and stays the same for a copy of it:

* a packaged alias: the SHA-256 of its GGUF (the multi-part aliases' known digest; SmolLM2's file hashed once per
  version of the file);
* a Hub id: the resolved commit;
* a ``.gguf`` file: its SHA-256 (hashed once per version of the file, as the conversion cache does);
* a folder (a ``posbias train`` run resolves to the model it trained): every file's name and size, the full
  SHA-256 of files up to 4 MiB (configs, tokenizer, factors, adapter) and of three 1 MiB samples of larger ones
  (weights: start, middle, end); an ``apply`` adapter adds its base model's content.

:data:`posbias.utils.run_folder.CONTENT_KEYS` compares it whenever a folder recorded it.
"""
from __future__ import annotations

import hashlib
from pathlib import Path

from posbias.models.adapter import read_adapter
from posbias.models.gguf_cache import gguf_sha256
from posbias.models.hub import looks_like_hub_id, resolve_hub_model
from posbias.models.packaged import ALIASES, locate_parts
from posbias.models.trained import trained_model_folder

SMALL = 4 << 20  # files up to this size are hashed whole
SAMPLE = 1 << 20  # larger files: three samples of this size
MAX_DEPTH = 4  # adapters on adapters: deeper is refused (a folder pointing at itself)


def model_content(spec: str, revision: str | None = None, *, _depth: int = 0) -> str:
    """The content identity of the model ``spec`` names (module docstring)."""
    if _depth > MAX_DEPTH:
        raise ValueError(f"{spec}: an adapter chain deeper than {MAX_DEPTH} (a folder whose base model is itself?)")
    if spec in ALIASES:
        packaged = ALIASES[spec]
        return f"sha256:{packaged.sha256 or gguf_sha256(locate_parts(packaged)[0])}"
    if looks_like_hub_id(spec):
        return f"hub:{resolve_hub_model(spec, revision).commit}"
    path = Path(spec).expanduser()
    if path.is_file():
        return f"sha256:{gguf_sha256(path)}"
    if not path.is_dir():
        return "missing"
    path = trained_model_folder(path)
    digest = folder_digest(path)
    adapter = read_adapter(path)
    if adapter is not None and not adapter.merged:
        digest += "+" + model_content(adapter.base_spec(), revision, _depth=_depth + 1)
    return digest


def folder_digest(path: Path) -> str:
    """``files:<sha256>`` over every file of the folder (subfolders included, dotfiles left out)."""
    h = hashlib.sha256()
    for f in sorted(p for p in path.rglob("*") if p.is_file() and not p.name.startswith(".")):
        size = f.stat().st_size
        h.update(f"{f.relative_to(path).as_posix()}|{size}|".encode())
        with open(f, "rb") as fh:
            if size <= SMALL:
                h.update(hashlib.sha256(fh.read()).digest())
                continue
            for at in (0, (size - SAMPLE) // 2, size - SAMPLE):
                fh.seek(at)
                h.update(hashlib.sha256(fh.read(SAMPLE)).digest())
    return f"files:{h.hexdigest()}"
