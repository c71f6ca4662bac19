"""Write the folder of ``posbias apply``: an adapter (base model + method, a few KB) or, with ``merge``, a
standalone model folder that plain transformers loads with the scaling active (``trust_remote_code=True``).

The folder is written into a hidden sibling and renamed into place at the end, so an interrupted apply
never leaves a half-written folder (:func:`write_applied`). The formats are described in
:mod:`posbias.models.adapter`.
"""
from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

from safetensors import SafetensorError

from posbias.architecture.layers import get_decoder_layers
from posbias.methods import apply_method
from posbias.methods.moice import CONFIG_FILE as ROUTERS_CONFIG
from posbias.methods.moice import WEIGHTS_FILE as ROUTERS_WEIGHTS
from posbias.methods.moice import router_files
from posbias.methods.registry import check_method, resolve_method
from posbias.methods.temperature import JOINT_TARGET
from posbias.models import modeling_posbias as remote
from posbias.models.adapter import (
    ADAPTER_FILE,
    ADAPTER_FORMAT,
    ADAPTER_METHODS,
    ADAPTER_VERSION,
    FACTORS_FILE,
    ROUTERS_DIR,
)
from posbias.patching.rope_scaling import load_factors_file, write_model_factors
from posbias.utils.io import versions

MERGE_METHODS = ("lpes", "pi")  # per-layer RoPE factors, which modeling_posbias.py re-applies
MODELING_FILE = "modeling_posbias.py"
# Why a method cannot be written as an adapter folder (apply refuses it with this reason).
NOT_ADAPTABLE = {
    "attention-buckets": "it is a wrapper that runs the model once per RoPE base and mixes the logits, not a "
                         "change to the model, so a loaded folder could not be the transformers model (generate, "
                         "hidden states) that every caller uses",
}
# Why a method cannot be merged into a standalone folder: it changes attention, not only the RoPE tables.
NOT_MERGEABLE = {
    "ms-poe": "Ms-PoE picks each head's interpolation ratio from the attention scores of every prompt",
    "moice": "MoICE routes every head and token over several RoPE bases with trained routers",
}
# Options of a moice adapter: the routers file fixes the rest (multipliers, bases, hidden, layers).
MOICE_STORED = ("top_k", "rotated_cache")


def check_apply_request(method: str, options: dict, merge: bool) -> str:
    """The canonical method name, after every check that needs no model (the method, its options, a
    factors file or routers); :class:`ValueError` with one line otherwise."""

    name = resolve_method(method).name
    if name not in ADAPTER_METHODS:
        reason = NOT_ADAPTABLE.get(name, "apply writes methods that patch the model in place "
                                         f"({', '.join(ADAPTER_METHODS)})")
        raise ValueError(f"apply cannot write {name}: {reason}; evaluate it with --method {name} on the base model")
    if merge and name not in MERGE_METHODS:
        reason = NOT_MERGEABLE.get(name, "")
        raise ValueError(f"--merge writes per-layer RoPE factors ({', '.join(MERGE_METHODS)}), which "
                         f"modeling_posbias.py re-applies; {name} changes attention itself"
                         f"{f' ({reason})' if reason else ''}: leave out --merge to write an adapter folder")
    if merge and name == "lpes" and _joint_factors(options.get("factors")):
        raise ValueError(f"--merge writes per-layer RoPE factors only, and {options['factors']} also holds the "
                         "temperatures of a joint search: leave out --merge to write an adapter folder")
    if name == "moice" and not options.get("routers"):
        raise ValueError("apply writes moice with trained routers: --method-opt routers=DIR "
                         "(from posbias train-moice)")
    check_method(name, options)
    return name


def _joint_factors(path) -> bool:
    """Whether ``path`` is a factors file of a joint RoPE + temperature search (False when unreadable:
    the method's own check names that problem)."""
    try:
        return load_factors_file(Path(str(path)).expanduser()).get("target") == JOINT_TARGET
    except (ValueError, TypeError):
        return False


def write_applied(out: str | Path, *, spec: str, model, tokenizer, method: str, options: dict,
                  merge: bool = False) -> Path:
    """Write the adapter (or, with ``merge``, the standalone) folder of ``method`` on ``model`` (loaded from
    ``spec``, unpatched) to ``out``, replacing a folder an earlier apply wrote there."""

    handle = apply_method(model, method, **options)  # checks the options against this model
    handle.remove()
    out = Path(out)
    remove_stale_staging(out)
    staging = out.parent / f".{out.name}.apply-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    try:
        stored = dict(handle.options)
        if method == "lpes":
            factors = _write_lpes_factors(model, options["factors"], staging)
            stored["factors"] = FACTORS_FILE
        if method == "moice":
            _copy_routers(options["routers"], staging / ROUTERS_DIR)
            stored = {**{k: stored[k] for k in MOICE_STORED}, "routers": ROUTERS_DIR}
        if merge:
            per_layer = factors if method == "lpes" else [float(stored["factor"])] * len(get_decoder_layers(model))
            try:
                write_merged(staging, model, tokenizer, method, per_layer)
            except SafetensorError as e:  # a full disk, mostly: safetensors raises its own error type
                raise OSError(f"writing the merged weights into {out.parent} failed ({e}); is the disk full?") from None
        doc = adapter_doc(spec, model, method, stored, merge)
        (staging / ADAPTER_FILE).write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
        (staging / "README.md").write_text(readme(doc, out.name), encoding="utf-8")
        _swap_into_place(staging, out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return out


def remove_stale_staging(out: Path) -> None:
    """Remove the staging folders that killed ``apply`` runs left beside ``out`` (``.<name>.apply-<pid>`` of a
    process that no longer runs; with ``--merge`` a full copy of a model), saying so in one line each."""
    for stale in out.parent.glob(f".{out.name}.apply-*"):
        pid = stale.name.rsplit("-", 1)[-1]
        if not pid.isdigit() or int(pid) == os.getpid() or _alive(int(pid)):
            continue
        shutil.rmtree(stale, ignore_errors=True)
        print(f"removed {stale}: the staging folder of a posbias apply that was killed", file=sys.stderr)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def _write_lpes_factors(model, factors_path, folder: Path) -> list[float]:

    return write_model_factors(model, Path(str(factors_path)).expanduser(), folder / FACTORS_FILE)


def _copy_routers(routers, folder: Path) -> None:
    """Copy the MoICE routers saved at ``routers`` (their folder or safetensors file) into ``folder``."""
    weights, config = router_files(routers)
    folder.mkdir()
    shutil.copyfile(weights, folder / ROUTERS_WEIGHTS)
    shutil.copyfile(config, folder / ROUTERS_CONFIG)


def adapter_doc(spec: str, model, method: str, options: dict, merged: bool) -> dict:
    """The content of ``posbias_adapter.json``: the method, its options and the base model's spec, path and
    revision (the Hugging Face commit where the model came from the Hub)."""

    local = Path(str(spec)).expanduser()
    return {"format": ADAPTER_FORMAT, "version": ADAPTER_VERSION, "method": method, "options": options,
            "base_model": {"spec": str(spec), "path": str(local.resolve()) if local.exists() else None,
                           "revision": getattr(model.config, "_commit_hash", None),
                           "model_type": model.config.model_type,
                           "num_layers": len(get_decoder_layers(model))},
            "merged": merged, "versions": versions()}


def write_merged(folder: Path, model, tokenizer, method: str, factors: list[float]) -> None:
    """Weights, tokenizer, ``modeling_posbias.py`` and a ``posbias-scaled`` ``config.json`` whose ``auto_map``
    points at it, so ``AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True)`` re-applies the
    scaling and transformers refuses the folder without ``trust_remote_code``."""

    _check_mergeable(model)
    model.save_pretrained(folder)
    if tokenizer is not None:
        tokenizer.save_pretrained(folder)
    shutil.copyfile(remote.__file__, folder / MODELING_FILE)
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    config.update({
        remote.BASE_TYPE_KEY: config["model_type"],
        remote.BASE_ARCHITECTURES_KEY: config.get("architectures"),
        "model_type": remote.MODEL_TYPE,
        "architectures": [remote.PosbiasScaledForCausalLM.__name__],
        "auto_map": {"AutoConfig": f"modeling_posbias.{remote.PosbiasScaledConfig.__name__}",
                     "AutoModelForCausalLM": f"modeling_posbias.{remote.PosbiasScaledForCausalLM.__name__}"},
        remote.SCALING_KEY: {"method": method, "factors": [float(f) for f in factors]},
    })
    (folder / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def _check_mergeable(model) -> None:
    """The layout ``modeling_posbias.py`` assumes: ``model.model.layers`` and one ``model.model.rotary_emb``."""

    inner = getattr(model, "model", None)
    layers = getattr(inner, "layers", None)
    if layers is None or getattr(inner, "rotary_emb", None) is None or list(layers) != list(get_decoder_layers(model)):
        raise ValueError(f"--merge supports models with model.model.layers and one model.model.rotary_emb; "
                         f"{type(model).__name__} differs: leave out --merge to write an adapter folder")


def _swap_into_place(staging: Path, out: Path) -> None:
    """Rename ``staging`` to ``out``; an existing ``out`` (an earlier apply's folder, or empty) is moved
    aside first and deleted after."""
    if not out.exists():
        os.replace(staging, out)
        return
    old = out.parent / f".{out.name}.replaced-{os.getpid()}"
    shutil.rmtree(old, ignore_errors=True)
    os.replace(out, old)
    os.replace(staging, out)
    shutil.rmtree(old, ignore_errors=True)


def readme(doc: dict, name: str) -> str:
    """A short README.md for the folder: what it holds and how to load it."""
    base = doc["base_model"]
    opts = ", ".join(f"{k}={v}" for k, v in doc["options"].items()) or "defaults"
    lines = [f"# {name}: {base['spec']} + {doc['method']} (posbias)", "",
             f"Method `{doc['method']}` ({opts}) on the base model `{base['spec']}`"
             + (f" (revision {base['revision']})" if base.get("revision") else "") + ".", ""]
    if doc["merged"]:
        lines += [("A standalone copy: the base weights, the tokenizer, and `modeling_posbias.py`, which re-applies "
                  "the per-layer RoPE scaling when loaded with"), "",
                  "```python", "from transformers import AutoModelForCausalLM",
                  f'model = AutoModelForCausalLM.from_pretrained("{name}", trust_remote_code=True)', "```", "",
                  ("Without `trust_remote_code=True` transformers refuses the folder (model type "
                  "`posbias-scaled`) rather than loading the unscaled model.")]
    else:
        lines += ["An adapter: only the method's settings. Load the base model with the method active:", "",
                  "```python", "from posbias.models import load_model",
                  f'model, tokenizer = load_model("{name}")', "```", "",
                  "or pass the folder as `--model` to any posbias command."]
    return "\n".join(lines) + "\n"
