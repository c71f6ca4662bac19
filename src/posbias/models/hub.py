"""Hugging Face Hub model ids (``org/name``, optionally at ``--revision``) resolved to a local snapshot.

The local Hugging Face cache is looked at first (``HF_HUB_CACHE``, else ``HF_HOME/hub``, else
``~/.cache/huggingface/hub``); a model that is not cached is downloaded through ``huggingface_hub``
(config, tokenizer and safetensors files) unless ``HF_HUB_OFFLINE=1`` or the network is unreachable,
in which case one line says so and how to fetch it. The snapshot folder's name is the resolved commit.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from huggingface_hub import errors, snapshot_download

from posbias.architecture.layers import ModelLoadError

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
# What a causal LM needs (weights in safetensors; no second copy in .bin / .pth / GGUF).
DOWNLOAD_PATTERNS = ["*.json", "*.safetensors", "*.model", "*.tiktoken", "*.txt", "*.jinja"]


@dataclass(frozen=True)
class HubSnapshot:
    """A Hub model in the local cache: ``repo_id`` at ``revision`` (as asked) is ``commit``, in ``path``."""

    repo_id: str
    revision: str | None
    commit: str
    path: Path

    def record(self) -> dict:
        return {"hub_id": self.repo_id, "revision": self.revision, "commit": self.commit}


def looks_like_hub_id(spec: str) -> bool:
    """``org/name`` that is not an existing path (``Qwen/Qwen2.5-0.5B``)."""
    return bool(_HUB_ID.match(str(spec))) and not Path(spec).expanduser().exists()


def hub_cache_dir() -> Path:
    """The Hugging Face hub cache, read from the environment when called."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    home = os.environ.get("HF_HOME") or Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "huggingface"
    return Path(home).expanduser() / "hub"


def hub_offline() -> bool:
    """``HF_HUB_OFFLINE`` (or transformers' ``TRANSFORMERS_OFFLINE``) is set: nothing is downloaded."""
    return any(os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")
               for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))


def download_hint(repo_id: str, revision: str | None) -> str:
    rev = f" --revision {revision}" if revision else ""
    return f"`hf download {repo_id}{rev}` (or `huggingface-cli download {repo_id}{rev}`) on a machine with network"


def resolve_hub_model(repo_id: str, revision: str | None = None) -> HubSnapshot:
    """The local snapshot of ``repo_id`` at ``revision`` (default ``main``), downloading it if allowed.

    Raises :class:`ModelLoadError` (one line) when it is not cached and cannot be fetched.
    """

    kwargs = {"repo_id": repo_id, "revision": revision, "cache_dir": str(hub_cache_dir())}
    try:
        path = snapshot_download(**kwargs, local_files_only=True)
    except Exception:  # noqa: BLE001 - huggingface_hub raises several kinds for "not cached"
        if hub_offline():
            raise ModelLoadError(f"model {repo_id!r}{_at(revision)}: no such folder, and not in the Hugging Face "
                                 f"cache ({hub_cache_dir()}) with HF_HUB_OFFLINE=1: fetch it with "
                                 f"{download_hint(repo_id, revision)}") from None
        path = _download(kwargs, repo_id, revision)
    path = Path(path)
    return HubSnapshot(repo_id, revision, path.name, path)


def _download(kwargs: dict, repo_id: str, revision: str | None) -> str:

    try:
        return snapshot_download(**kwargs, allow_patterns=DOWNLOAD_PATTERNS)
    except errors.GatedRepoError:
        raise ModelLoadError(f"model {repo_id!r} is gated: accept its licence on huggingface.co and log in "
                             "(`hf auth login`), then retry") from None
    except errors.RevisionNotFoundError:
        raise ModelLoadError(f"model {repo_id!r} has no revision {revision!r} on the Hub") from None
    except errors.RepositoryNotFoundError:
        raise ModelLoadError(f"model {repo_id!r} not found: no such folder, alias or Hugging Face Hub model "
                             "(a private model needs `hf auth login`)") from None
    except Exception as e:  # noqa: BLE001 - network failures come in many types (httpx, OSError, ...)
        line = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ModelLoadError(f"model {repo_id!r}{_at(revision)} is not in the Hugging Face cache and could not be "
                             f"downloaded ({line}): fetch it with {download_hint(repo_id, revision)}") from None


def _at(revision: str | None) -> str:
    return f" at revision {revision!r}" if revision else ""
