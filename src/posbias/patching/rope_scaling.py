"""Layer-specific RoPE position interpolation (LPES) without touching any weight.

Decoder layer ``l`` sees positions ``m / s_l`` instead of ``m``: its rotary ``(cos, sin)`` come from
the model's own rotary module fed the float positions ``m / s_l``
(:meth:`posbias.architecture.rope_layout.RopeLayout.cos_sin`), so the scaling is linear position
interpolation in whatever layout and rope type the model has: rotate-half or interleaved pairs
(Cohere), partial rotary (Phi-3), one base per layer type (Gemma 3's sliding and full layers),
default, linear, llama3 or yarn frequencies, and the module's own ``attention_scaling``.

Mechanism (transformers 5.x): the base model computes one shared ``(cos, sin)`` per layer type in
``model.model.rotary_emb`` and passes it to every decoder layer as the keyword
``position_embeddings`` together with ``position_ids``. A forward pre-hook (``with_kwargs=True``)
on each layer with ``s_l != 1`` replaces ``position_embeddings`` by its own. Layers with a factor
of exactly 1 get no hook at all, so their inputs are bit-identical to the unpatched model.
Within one forward pass the ``(cos, sin)`` of a factor are computed once and shared by every
layer with that factor and layer type (cached on the identity of the ``position_ids`` tensor);
tables of positions ``0..P-1`` per factor are kept until the rotary module's ``inv_freq`` changes.
Rope types that adapt their frequencies to the sequence length (dynamic, longrope) are computed
directly at every forward, with the scaled positions deciding the adaptation.

Keys are rotated before they enter the KV cache, so ``generate()`` with a cache works unchanged:
each decoding step's new keys/queries get the scaled rotation of their own positions.

Factors files (JSON) store the found curve::

    {"format": "posbias-lpes-factors", "version": 1, "model": ..., "num_layers": L,
     "factors": [...], "curve": {"type": "bezier", "control_points": [[x, y], ...]},
     "task": ..., "score": ..., ...}

:func:`apply_factors_file` applies it to a model; when the model's layer count differs from
``num_layers`` the curve is re-evaluated at the new normalised depths ``l / (L - 1)``.
"""
from __future__ import annotations

import math
import numbers
import os
import shutil
import sys
import warnings
import weakref
from pathlib import Path
from typing import Any, Sequence

import torch

from posbias.architecture.layers import get_decoder_layers
from posbias.architecture.rope_layout import rope_layout
from posbias.patching.curves import CURVE_KINDS, check_control_points, check_grid, curve_factors
from posbias.utils.io import atomic_write_json, read_json

FACTORS_FORMAT = "posbias-lpes-factors"
FACTORS_VERSION = 1
SAVED_FACTORS_NAME = "posbias_factors.json"
# The factors a layer may get: positions m / s_l with s_l outside this range are no interpolation any
# model was measured with (1e-300 makes every log-prob NaN; 1e300 maps every position to 0).
FACTOR_MIN, FACTOR_MAX = 1e-3, 1e3

__all__ = [
    "ScalingHandle", "active_scaling", "apply_layer_scaling", "remove_layer_scaling", "validate_factors",
    "save_factors_file", "load_factors_file", "factors_for_model", "apply_factors_file",
    "FactorsFileError", "SAVED_FACTORS_NAME", "window_overreach",
]


class FactorsFileError(ValueError):
    """A factors file that is malformed or does not fit the model."""


def _layout(model):

    return rope_layout(model)


def validate_factors(factors: Sequence[float], num_layers: int) -> tuple[float, ...]:
    """Check one factor per layer, each in ``[FACTOR_MIN, FACTOR_MAX]`` (1e-3 .. 1e3); return them as a
    tuple of floats. A number too large for a float is refused like any other out of range."""
    if isinstance(factors, (str, bytes, dict)) or not hasattr(factors, "__iter__"):
        raise ValueError(f"factors must be a list of numbers, got {factors!r}")
    items = list(factors.tolist() if hasattr(factors, "tolist") else factors)
    not_numbers = [f for f in items if isinstance(f, bool) or not isinstance(f, numbers.Real)]
    if not_numbers:
        f = not_numbers[0]
        raise ValueError(f"factors must be numbers, got {f!r} ({type(f).__name__})")
    if len(items) != num_layers:
        raise ValueError(f"got {len(items)} factors for a model with {num_layers} decoder layers; give one per layer")
    for i, f in enumerate(items):
        try:
            value = float(f)
        except OverflowError:
            value = math.inf
        if not (math.isfinite(value) and FACTOR_MIN <= value <= FACTOR_MAX):
            shown = f"{str(f)[:12]}... ({len(str(f))} digits)" if len(str(f)) > 24 else str(f)
            raise ValueError(f"factor {shown} for layer {i} is invalid: every factor must be a number from "
                             f"{FACTOR_MIN:g} to {FACTOR_MAX:g}")
    return tuple(float(f) for f in items)


def _version(t: torch.Tensor) -> int:
    """In-place modification counter (inference tensors have none and cannot be modified in place
    outside inference mode: 0)."""
    return 0 if t.is_inference() else t._version


# The scaling active on each model: a weak reference to its handle, keyed weakly by the model.
_ACTIVE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


class ScalingHandle:
    """Active per-layer scaling on a model; ``remove()`` (or leaving the ``with`` block) undoes it."""

    max_table_bytes: int = 512 * 2**20  # memory for the cached cos/sin tables of all factors

    def __init__(self, model, factors: tuple[float, ...], layout):
        self.model = model
        self.factors = factors
        self.layout = layout
        self._hooks: list[Any] = []
        # per-forward (cos, sin) cache, keyed on the position_ids tensor of that forward
        self._pos_ref: torch.Tensor | None = None
        self._pos_key: tuple | None = None
        self._cs: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}
        self._need, self._span = -1, None
        # per-(factor, layer type) cos/sin tables over positions 0..P-1 (see cos_sin)
        self._tables: dict[tuple, tuple] = {}
        self._distinct = {(f, lr.layer_type) for f, lr in zip(factors, layout.layers) if f != 1.0}
        self.removed = False

    # -- computation -------------------------------------------------------------------------
    def _freq_key(self, layer_type: str | None) -> tuple:
        """Identity + version of the rotary inv_freq buffer: tables are stale once it changes."""
        inv = self.layout.inv_freq(layer_type)
        return id(inv), _version(inv)

    def _direct(self, factor: float, positions: torch.Tensor, like: torch.Tensor, layer_type=None):
        """The model's own rotary module at positions ``positions / factor``: (B, L, rotary_dim)."""
        return self.layout.cos_sin(positions.float() / factor, like, layer_type)

    def _table(self, factor: float, layer_type, need: int, like: torch.Tensor):
        """Cached ``(cos, sin)`` rows for positions ``0..size-1`` (``size >= need``, a power of two; a
        table that is too short is extended by the missing rows only), or None when
        they would exceed :attr:`max_table_bytes` together with the other factors' tables, or when
        the rotary module adapts its frequencies to the positions it sees (dynamic, longrope)."""
        if self.layout.length_dependent(layer_type):
            return None
        # tables made in inference mode are inference tensors: not reused outside it (autograd)
        key = (self._freq_key(layer_type), like.dtype, like.device, torch.is_inference_mode_enabled())
        tab = self._tables.get((factor, layer_type))
        have = tab[1].shape[0] if tab is not None and tab[0] == key else 0  # rows already computed (need >= 1)
        if have >= need:
            return tab[1], tab[2]
        size = max(256, 1 << (need - 1).bit_length())
        dims = self.layout.inv_freq(layer_type).numel() * 2
        per = size * dims * 2 * like.element_size()
        if per * max(len(self._distinct), 1) > self.max_table_bytes:
            return None
        cos, sin = self._direct(factor, torch.arange(have, size, device=like.device)[None], like, layer_type)
        cos, sin = cos[0], sin[0]
        if have:  # growing (e.g. decoding past the prompt's power of two): only the new rows
            cos, sin = torch.cat([tab[1], cos]), torch.cat([tab[2], sin])
        self._tables[(factor, layer_type)] = (key, cos, sin)
        return cos, sin

    def cos_sin(self, factor: float, position_ids: torch.Tensor, like: torch.Tensor, layer_type=None):
        """``(cos, sin)`` for positions ``position_ids / factor``, in ``like``'s dtype/device.

        Rows come from a per-factor table of positions ``0..P-1`` (built once by the model's own
        rotary module, grown by doubling): the same float operations on the same positions as a
        direct call, so the values are identical, but a forward pass costs a slice (consecutive
        positions of one row: prefill without padding, each decoding step) or a gather (e.g.
        left-padded batches) instead of ``cos``/``sin`` of every position. Non-integer or negative
        positions are computed directly.
        """
        key = (_version(position_ids), like.dtype, like.device)
        if position_ids is not self._pos_ref or key != self._pos_key:
            need, span = -1, None
            if not position_ids.is_floating_point() and position_ids.numel():
                lo, hi = (int(v) for v in torch.aminmax(position_ids))
                need = hi + 1 if lo >= 0 else -1
                n = position_ids.shape[-1]
                if (need > 0 and position_ids.dim() == 2 and position_ids.shape[0] == 1 and hi - lo + 1 == n
                        and torch.equal(position_ids[0], torch.arange(lo, hi + 1, device=position_ids.device))):
                    span = (lo, hi + 1)  # consecutive positions: a view of the table, no copy
            self._pos_ref, self._pos_key, self._cs = position_ids, key, {}
            self._need, self._span = need, span
        ck = (factor, layer_type, self._freq_key(layer_type))
        hit = self._cs.get(ck)
        if hit is not None:
            return hit
        tab = self._table(factor, layer_type, self._need, like) if self._need > 0 else None
        if tab is not None and self._span is not None:
            a, b = self._span
            out = (tab[0][None, a:b], tab[1][None, a:b])
        elif tab is not None:
            out = (tab[0][position_ids], tab[1][position_ids])
        else:
            out = self._direct(factor, position_ids, like, layer_type)
        self._cs[ck] = out
        return out

    def _make_hook(self, layer_idx: int, factor: float):
        layer_type = self.layout.layers[layer_idx].layer_type

        def hook(module, args, kwargs):
            pe = kwargs.get("position_embeddings")
            if pe is None:
                raise RuntimeError(
                    f"decoder layer {layer_idx} ({type(module).__name__}) was called without the keyword "
                    "'position_embeddings'; per-layer RoPE scaling supports transformers 5.x decoder layers"
                )
            pos = kwargs.get("position_ids")
            if pos is None:
                cp = kwargs.get("cache_position")
                if cp is None:
                    raise RuntimeError(
                        f"decoder layer {layer_idx} received neither position_ids nor cache_position"
                    )
                pos = cp.unsqueeze(0)
            cos, sin = self.cos_sin(factor, pos, pe[0], layer_type)
            kwargs = dict(kwargs)
            kwargs["position_embeddings"] = (cos, sin)
            return args, kwargs

        return hook

    # -- lifecycle ---------------------------------------------------------------------------
    def _install(self) -> None:

        for i, (layer, f) in enumerate(zip(get_decoder_layers(self.model), self.factors)):
            if f == 1.0:
                continue
            self._hooks.append(layer.register_forward_pre_hook(self._make_hook(i, f), with_kwargs=True))
        # a no-op hook through which the model holds its handle (an all-ones scaling has no layer hook)
        self._hooks.append(self.model.register_forward_pre_hook(self._keep_alive))
        _ACTIVE[self.model] = weakref.ref(self)

    def _keep_alive(self, module, args) -> None:
        return None

    def remove(self) -> None:
        """Remove the hooks; the model computes exactly as before. Idempotent."""
        for h in self._hooks:
            h.remove()
        self._hooks.clear()
        self._cs, self._pos_ref, self._tables = {}, None, {}
        if active_scaling(self.model) is self:
            del _ACTIVE[self.model]
        self.removed = True

    def __enter__(self) -> "ScalingHandle":
        return self

    def __exit__(self, *exc) -> None:
        self.remove()

    def __repr__(self) -> str:
        state = "removed" if self.removed else f"{len(self._hooks) - 1} layers patched"
        return f"ScalingHandle({state}, factors={list(self.factors)})"


def apply_layer_scaling(model, factors: Sequence[float]) -> ScalingHandle:
    """Give decoder layer ``l`` the RoPE of positions ``m / factors[l]``.

    A scaling already applied to ``model`` (by this function or ``apply_factors_file``) is removed
    first, so calling it again swaps the factors. Returns a handle with ``.remove()``; it is also a
    context manager.

    Raises:
        ValueError: a model without rotary embeddings, a wrong number of factors, or a factor that is
            not a number from 1e-3 to 1e3.
    """

    layout = _layout(model)  # RopeLayoutError (a ValueError) for a model that cannot be patched
    layers = get_decoder_layers(model)
    facs = validate_factors(factors, len(layers))
    remove_layer_scaling(model)
    overreach = window_overreach(model, facs, layout)
    if overreach:
        warnings.warn(overreach, stacklevel=2)
    handle = ScalingHandle(model, facs, layout)
    handle._install()
    return handle


def window_overreach(model, factors: Sequence[float], layout) -> str | None:
    """Why ``factors`` take sliding-window layers past their window, or None when they do not.

    A ``sliding_attention`` layer with window ``W`` attends to keys at distances ``0 .. W - 1`` only, the
    distances it was trained on; a factor ``s < 1`` rotates them as distances up to ``(W - 1) / s``. On
    Gemma 3 270M (W = 512) factors of 0.9-0.7 found on 400-token prompts make it fail a 2K-token needle
    it otherwise finds at every depth (docs/results/fixes-qwen-gemma); the same factors on its
    full-attention layers only do not (nor do they keep the gain on the short prompts).
    The message is the same for any such factors, so Python shows it once per process (a search
    applying many candidates warns once).
    """
    window = getattr(model.config.get_text_config(), "sliding_window", None)
    if not window:
        return None
    if not any(f < 1.0 and lr.layer_type == "sliding_attention" for f, lr in zip(factors, layout.layers)):
        return None
    return (f"factors below 1 on sliding-window layers (window {window} tokens): on prompts longer than the "
            f"window these layers see relative positions beyond the {window - 1} they were trained on, "
            "which can collapse the model (Gemma 3 270M at 2K tokens); factors of 1 on those layers avoid it")


def active_scaling(model) -> ScalingHandle | None:
    """The handle of the scaling active on ``model`` (None without one); the model's hooks hold it."""
    ref = _ACTIVE.get(model)
    return None if ref is None else ref()


def remove_layer_scaling(model) -> bool:
    """Remove the scaling active on ``model``, if any; return whether there was one."""
    h = active_scaling(model)
    if h is None:
        return False
    h.remove()
    return True


# -- factors files -------------------------------------------------------------------------------
def save_factors_file(path: str | Path, *, factors: Sequence[float], curve: dict | None = None,
                      model: str | None = None, task: str | None = None, score: Any = None,
                      **extra: Any) -> dict:
    """Write a factors file atomically and return its content.

    ``curve`` is ``{"type": "bezier"|"linear"|"step", "control_points": [[x, y], ...]}`` (optional
    ``round_to_grid``: list of grid values); without it the file cannot be re-evaluated for
    another layer count.
    """

    facs = [float(f) for f in factors]
    validate_factors(facs, len(facs))
    if curve is not None:
        _check_curve(curve, path)
    doc = {"format": FACTORS_FORMAT, "version": FACTORS_VERSION, "model": model, "num_layers": len(facs),
           "factors": facs, "curve": curve, "task": task, "score": score, **extra}
    atomic_write_json(path, doc)
    return doc


def _check_curve(curve: Any, path) -> None:

    if not isinstance(curve, dict) or "type" not in curve or "control_points" not in curve:
        raise FactorsFileError(f"{path}: 'curve' must be an object with 'type' and 'control_points'")
    if curve["type"] not in CURVE_KINDS:
        raise FactorsFileError(f"{path}: unknown curve type {curve['type']!r} (known: {', '.join(CURVE_KINDS)})")
    try:
        check_control_points(curve["control_points"])
    except ValueError as e:
        raise FactorsFileError(f"{path}: bad curve control points: {e}") from None
    if curve.get("round_to_grid") is not None:
        try:
            check_grid(curve["round_to_grid"])
        except (ValueError, TypeError) as e:
            raise FactorsFileError(f"{path}: bad curve round_to_grid: {e}") from None


def load_factors_file(path: str | Path, num_layers: int | None = None) -> dict:
    """Read and validate a factors file.

    With ``num_layers`` the returned dict's ``factors`` fit that layer count: unchanged when it
    matches the file, re-evaluated from the curve otherwise (``FactorsFileError`` if the file has no
    curve). The file's own factors stay under ``saved_factors``.
    """

    path = Path(path)
    if not path.exists():
        raise FactorsFileError(f"factors file not found: {path}")
    if path.is_dir():
        inside = [p.name for p in (path / "best_factors.json", path / SAVED_FACTORS_NAME) if p.is_file()]
        hint = f" (it holds {inside[0]}: give {path / inside[0]})" if inside else ""
        raise FactorsFileError(f"{path} is a folder, not a factors file{hint}; a factors file is the "
                               "best_factors.json that posbias search writes")
    try:
        doc = read_json(path)
    except ValueError as e:
        raise FactorsFileError(str(e)) from None
    if not isinstance(doc, dict):
        raise FactorsFileError(f"{path}: expected a JSON object with 'factors', got {type(doc).__name__}")
    if "factors" not in doc or not isinstance(doc["factors"], list):
        raise FactorsFileError(f"{path}: missing the list 'factors' (one RoPE factor per decoder layer)")
    try:
        facs = validate_factors(doc["factors"], len(doc["factors"]))
    except ValueError as e:
        raise FactorsFileError(f"{path}: {e}") from None
    declared = doc.get("num_layers", len(facs))
    if declared != len(facs):
        raise FactorsFileError(f"{path}: num_layers is {declared} but the file lists {len(facs)} factors")
    if doc.get("curve") is not None:
        _check_curve(doc["curve"], path)
    doc["factors"] = list(facs)
    doc["saved_factors"] = list(facs)
    if num_layers is not None and num_layers != len(facs):
        doc["factors"] = list(factors_for_model(doc, num_layers, path=path))
        _announce_resampling(path, doc, num_layers)
    return doc


_ANNOUNCED: set = set()


def _announce_resampling(path: Path, doc: dict, num_layers: int) -> None:
    """One line on stderr (once per file and layer count in a process): the factors used are not the
    file's but its curve re-evaluated for another depth."""

    key = (str(Path(path).resolve()), num_layers)
    if key in _ANNOUNCED:
        return
    _ANNOUNCED.add(key)
    found = f" (found on {doc['model']})" if doc.get("model") else ""
    print(f"note: {path} holds {len(doc['saved_factors'])} factors{found}; the model has {num_layers} decoder "
          f"layers, so its curve is resampled at their normalised depths", file=sys.stderr)


def factors_for_model(doc: dict, num_layers: int, *, path: Any = "<factors>") -> tuple[float, ...]:
    """The factors of a loaded factors file for a model with ``num_layers`` layers."""
    saved = doc.get("saved_factors", doc["factors"])
    if num_layers == len(saved):
        return tuple(float(f) for f in saved)
    curve = doc.get("curve")
    if curve is None:
        raise FactorsFileError(
            f"{path}: has {len(saved)} factors but the model has {num_layers} decoder layers, and no "
            "'curve' to re-evaluate at the new depths"
        )

    try:
        vals = curve_factors(curve["type"], curve["control_points"], num_layers,
                             round_to_grid=curve.get("round_to_grid"))
        return validate_factors([float(v) for v in vals], num_layers)
    except (ValueError, TypeError) as e:
        raise FactorsFileError(f"{path}: its curve gives no factors for {num_layers} layers ({e})") from None


def apply_factors_file(model, path: str | Path) -> ScalingHandle:
    """Apply a factors file to ``model`` (re-evaluating its curve for another layer count)."""

    _layout(model)
    n = len(get_decoder_layers(model))
    doc = load_factors_file(path, num_layers=n)
    return apply_layer_scaling(model, doc["factors"])


def save_patched_model(model, tokenizer, factors_path: str | Path, out: str | Path) -> Path:
    """Write ``model``'s weights + tokenizer + a copy of the factors file to ``out`` (the folder of
    ``posbias apply`` before adapters: :mod:`posbias.models.adapter` reads it as merged lpes).

    ``posbias.models.load_model(out)`` reloads it with the scaling active; plain transformers loads
    the (unchanged) weights. The weights are saved without hooks (they change no parameter). The
    folder is written beside ``out`` under a temporary name (factors file first) and renamed to
    ``out`` when complete, so a killed write leaves no ``out`` at all, never a folder that loads
    unpatched; the temporaries of killed writes are removed by the next one.
    """

    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    _remove_killed_writes(out)
    tmp = out.with_name(f".{out.name}.partial-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        tmp.mkdir()
        write_model_factors(model, factors_path, tmp / SAVED_FACTORS_NAME)
        model.save_pretrained(tmp)
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp)
        old = out.with_name(f".{out.name}.old-{os.getpid()}")
        if out.exists():
            os.replace(out, old)  # a folder this command wrote before (open_run checked it)
        os.replace(tmp, out)
        shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def _remove_killed_writes(out: Path) -> None:
    """Remove the temporary folders (``.<name>.partial-<pid>``) of killed writes of ``out`` whose
    process has ended."""

    for p in out.parent.glob(f".{out.name}.partial-*"):
        pid = p.name.rsplit("-", 1)[-1]
        try:
            os.kill(int(pid), 0)
        except (ValueError, ProcessLookupError):
            shutil.rmtree(p, ignore_errors=True)
        except PermissionError:
            pass


def write_model_factors(model, factors_path: str | Path, target: str | Path) -> list[float]:
    """Write the factors file ``factors_path`` as it applies to ``model`` into ``target``: a copy, or
    the curve re-evaluated for the model's layer count, naming this model and (``resampled_from``) the
    model and layer count the curve was found on. Returns the factors."""


    doc = load_factors_file(factors_path, num_layers=len(get_decoder_layers(model)))
    model_name = getattr(getattr(model, "config", None), "_name_or_path", None) or None
    if doc["factors"] == doc["saved_factors"]:
        shutil.copyfile(factors_path, target)
    else:  # re-evaluated for this model's depth: store the factors actually used
        extra = {k: v for k, v in doc.items() if k not in ("format", "version", "num_layers", "factors",
                                                             "saved_factors", "curve", "model", "task", "score",
                                                             "resampled_from")}
        extra["resampled_from"] = {"model": doc.get("model"), "num_layers": len(doc["saved_factors"])}
        save_factors_file(target, factors=doc["factors"], curve=doc.get("curve"), model=model_name,
                          task=doc.get("task"), score=doc.get("score"), **extra)
    return list(doc["factors"])
