"""Load a pretrained RoPE causal LM offline: a Hugging Face folder, a ``.gguf`` file (dequantised once,
:mod:`posbias.models.gguf_cache`), a Hub id, a packaged alias (:mod:`posbias.models.packaged`) or a folder
written by ``posbias apply``. Every load passes ``trust_remote_code=False``: posbias never runs a model
folder's own code.
"""
from __future__ import annotations

import contextlib
import warnings
from pathlib import Path

import torch
from safetensors import SafetensorError
from transformers import AutoModelForCausalLM, AutoTokenizer
from transformers.utils import logging as hf_logging

from posbias.architecture.layers import (  # noqa: F401 (re-exported)
    SUPPORTED_HINT,
    ModelLoadError,
    get_decoder_layers,
)
from posbias.architecture.rope_layout import RopeLayoutError, is_rotary_module, rope_layout
from posbias.models.adapter import read_adapter
from posbias.models.gguf_cache import cached_from_gguf, first_line
from posbias.models.hub import looks_like_hub_id, resolve_hub_model
from posbias.models.options import LoadOptions
from posbias.models.packaged import (  # noqa: F401 (re-exported: the aliases and their search targets)
    ALIASES,
    DEFAULT_SEARCH_TARGETS,
    default_search_target,
    resolve_alias,
)
from posbias.models.trained import register_folder_model_type, trained_model_folder
from posbias.utils.devices import Placement, ResolvedPlacement
from posbias.utils.io import read_json


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
        return resolve_alias(ALIASES[spec])
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
        base = adapter.base_spec()
        inner = read_adapter(resolve_spec(base, options.revision)) if not looks_like_hub_id(base) else None
        if inner is not None and not inner.merged:  # two methods stacked, one of them unrecorded
            raise ModelLoadError(f"{path}: its base model {base} is itself an adapter (method {inner.method}); an "
                                 f"adapter applies one method to a plain model: point its base_model at "
                                 f"{inner.base_spec()}")
        return adapter.apply(*load_model(base, options, dtype=dtype, device=device, require_rope=require_rope))
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
                             f"{first_line(e)})") from None
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
        raise ModelLoadError(f"cannot load {path} ({weights} truncated or damaged?): {first_line(e)}") from None
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
