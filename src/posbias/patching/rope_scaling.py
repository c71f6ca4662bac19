"""Layer-specific RoPE position interpolation (LPES) without touching any weight.

Decoder layer ``l`` sees positions ``m / s_l`` instead of ``m``: its rotary ``(cos, sin)`` are
computed from the model's own rotary module as ``inv_freq / s_l`` (so it composes with whatever
rope type the model already uses: default, linear, llama3, yarn, dynamic ...) times that module's
``attention_scaling``.

Mechanism (transformers 5.x): the base model computes one shared ``(cos, sin)`` in
``model.model.rotary_emb`` and passes it to every decoder layer as the keyword
``position_embeddings`` together with ``position_ids``. A forward pre-hook (``with_kwargs=True``)
on each layer with ``s_l != 1`` replaces ``position_embeddings`` by its own. Layers with a factor
of exactly 1 get no hook at all, so their inputs are bit-identical to the unpatched model.
Within one forward pass the ``(cos, sin)`` of a factor are computed once and shared by every
layer with that factor (cached on the identity of the ``position_ids`` tensor); the scaled
``inv_freq`` of a factor is cached until the rotary module's ``inv_freq`` changes (dynamic rope).

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

import json
import math
from pathlib import Path
from typing import Any, Sequence

import torch

FACTORS_FORMAT = "posbias-lpes-factors"
FACTORS_VERSION = 1
SAVED_FACTORS_NAME = "posbias_factors.json"

__all__ = [
    "ScalingHandle", "apply_layer_scaling", "remove_layer_scaling", "validate_factors",
    "save_factors_file", "load_factors_file", "factors_for_model", "apply_factors_file",
    "FactorsFileError", "SAVED_FACTORS_NAME",
]


class FactorsFileError(ValueError):
    """A factors file that is malformed or does not fit the model."""


def _rotary_module(model) -> torch.nn.Module:
    from posbias.models.loader import get_rotary_modules

    mods = get_rotary_modules(model)
    if not mods:
        raise ValueError(
            f"{type(model).__name__} has no rotary position embeddings (no '*rotary_emb' module with "
            f"inv_freq); per-layer RoPE scaling needs a RoPE model (Llama, Qwen2, Qwen3, Mistral, ...)"
        )
    base = getattr(model, "model", model)
    shared = getattr(base, "rotary_emb", None)
    if shared is not None and any(shared is m for m in mods):
        return shared
    if len(mods) > 1:
        raise ValueError(
            f"{type(model).__name__} has {len(mods)} rotary modules and none at model.model.rotary_emb; "
            "per-layer scaling supports models with one shared rotary module"
        )
    return mods[0]


def validate_factors(factors: Sequence[float], num_layers: int) -> tuple[float, ...]:
    """Check one positive finite factor per layer; return them as a tuple of floats."""
    try:
        out = tuple(float(f) for f in factors)
    except (TypeError, ValueError):
        raise ValueError(f"factors must be a sequence of numbers, got {factors!r}") from None
    if len(out) != num_layers:
        raise ValueError(f"got {len(out)} factors for a model with {num_layers} decoder layers; give one per layer")
    bad = [(i, f) for i, f in enumerate(out) if not math.isfinite(f) or f <= 0]
    if bad:
        i, f = bad[0]
        raise ValueError(f"factor {f} for layer {i} is invalid: every factor must be a finite number > 0")
    return out


def _version(t: torch.Tensor) -> int:
    """In-place modification counter (inference tensors have none and cannot be modified in place
    outside inference mode: 0)."""
    return 0 if t.is_inference() else t._version


class ScalingHandle:
    """Active per-layer scaling on a model; ``remove()`` (or leaving the ``with`` block) undoes it."""

    max_table_bytes: int = 512 * 2**20  # memory for the cached cos/sin tables of all factors

    def __init__(self, model, factors: tuple[float, ...], rotary: torch.nn.Module):
        self.model = model
        self.factors = factors
        self._rotary = rotary
        self._hooks: list[Any] = []
        # per-factor scaled inv_freq, valid for one rotary inv_freq tensor (identity + version)
        self._inv_ref: torch.Tensor | None = None
        self._inv_ver = -1
        self._inv_key: int | None = None
        self._inv: dict[float, torch.Tensor] = {}
        # per-forward (cos, sin) cache, keyed on the position_ids tensor of that forward
        self._pos_ref: torch.Tensor | None = None
        self._pos_key: tuple | None = None
        self._cs: dict[float, tuple[torch.Tensor, torch.Tensor]] = {}
        self._need, self._span = -1, None
        # per-factor cos/sin tables over positions 0..P-1 (see cos_sin)
        self._tables: dict[float, tuple] = {}
        self._distinct = {f for f in factors if f != 1.0}
        self.removed = False

    # -- computation -------------------------------------------------------------------------
    def _scaled_inv_freq(self, factor: float) -> torch.Tensor:
        base = self._rotary.inv_freq
        if base is not self._inv_ref or _version(base) != self._inv_ver:  # dynamic rope replaces it
            self._inv_ref, self._inv_ver, self._inv = base, _version(base), {}
            self._inv_key = (self._inv_key or 0) + 1  # a new generation: stale tables are rebuilt
        inv = self._inv.get(factor)
        if inv is None:
            inv = base.float() / factor
            self._inv[factor] = inv
        return inv

    def _direct(self, inv: torch.Tensor, positions: torch.Tensor, like: torch.Tensor):
        scaling = float(getattr(self._rotary, "attention_scaling", 1.0))
        with torch.autocast(device_type=like.device.type, enabled=False):
            freqs = positions[..., None].float() * inv.to(like.device)
            emb = torch.cat((freqs, freqs), dim=-1)
            return (emb.cos() * scaling).to(like.dtype), (emb.sin() * scaling).to(like.dtype)

    def _table(self, factor: float, inv: torch.Tensor, need: int, like: torch.Tensor):
        """Cached ``(cos, sin)`` rows for positions ``0..size-1`` (``size >= need``), or None when
        they would exceed :attr:`max_table_bytes` together with the other factors' tables."""
        # tables made in inference mode are inference tensors: not reused outside it (autograd)
        key = (self._inv_key, like.dtype, like.device, torch.is_inference_mode_enabled())
        tab = self._tables.get(factor)
        if tab is not None and tab[0] == key and tab[1].shape[0] >= need:
            return tab[1], tab[2]
        size = max(256, 1 << (need - 1).bit_length())
        per = size * inv.numel() * 2 * 2 * torch.empty((), dtype=like.dtype).element_size()
        if per * max(len(self._distinct), 1) > self.max_table_bytes:
            return None
        cos, sin = self._direct(inv, torch.arange(size, device=like.device), like)
        self._tables[factor] = (key, cos, sin)
        return cos, sin

    def cos_sin(self, factor: float, position_ids: torch.Tensor, like: torch.Tensor):
        """``(cos, sin)`` for positions ``position_ids / factor``, in ``like``'s dtype/device.

        Rows come from a per-factor table of positions ``0..P-1`` (built once, grown by doubling):
        the same float operations on the same integer positions as a direct computation, so the
        values are identical, but a forward pass costs a slice (consecutive positions of one row:
        prefill without padding, each decoding step) or a gather (e.g. left-padded batches) instead
        of ``cos``/``sin`` of every position. Non-integer or negative positions are computed directly.
        """
        inv = self._scaled_inv_freq(factor)  # refreshes _inv_key when the rotary inv_freq changed
        key = (_version(position_ids), like.dtype, like.device, self._inv_key)
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
        hit = self._cs.get(factor)
        if hit is not None:
            return hit
        tab = self._table(factor, inv, self._need, like) if self._need > 0 else None
        if tab is not None and self._span is not None:
            a, b = self._span
            out = (tab[0][None, a:b], tab[1][None, a:b])
        elif tab is not None:
            out = (tab[0][position_ids], tab[1][position_ids])
        else:
            out = self._direct(inv, position_ids, like)
        self._cs[factor] = out
        return out

    def _make_hook(self, layer_idx: int, factor: float):
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
            cos, sin = self.cos_sin(factor, pos, pe[0])
            kwargs = dict(kwargs)
            kwargs["position_embeddings"] = (cos, sin)
            return args, kwargs

        return hook

    # -- lifecycle ---------------------------------------------------------------------------
    def _install(self) -> None:
        from posbias.models.loader import get_decoder_layers

        for i, (layer, f) in enumerate(zip(get_decoder_layers(self.model), self.factors)):
            if f == 1.0:
                continue
            self._hooks.append(layer.register_forward_pre_hook(self._make_hook(i, f), with_kwargs=True))
        self.model._posbias_scaling = self

    def remove(self) -> None:
        """Remove the hooks; the model computes exactly as before. Idempotent."""
        for h in self._hooks:
            h.remove()
        self._hooks.clear()
        self._cs, self._inv, self._pos_ref, self._inv_ref, self._tables = {}, {}, None, None, {}
        if getattr(self.model, "_posbias_scaling", None) is self:
            del self.model._posbias_scaling
        self.removed = True

    def __enter__(self) -> "ScalingHandle":
        return self

    def __exit__(self, *exc) -> None:
        self.remove()

    def __repr__(self) -> str:
        state = "removed" if self.removed else f"{len(self._hooks)} layers patched"
        return f"ScalingHandle({state}, factors={list(self.factors)})"


def apply_layer_scaling(model, factors: Sequence[float]) -> ScalingHandle:
    """Give decoder layer ``l`` the RoPE of positions ``m / factors[l]``.

    A scaling already applied to ``model`` (by this function or ``apply_factors_file``) is removed
    first, so calling it again swaps the factors. Returns a handle with ``.remove()``; it is also a
    context manager.

    Raises:
        ValueError: a model without rotary embeddings, a wrong number of factors, or a factor that is
            not a finite number > 0.
    """
    from posbias.models.loader import get_decoder_layers

    rotary = _rotary_module(model)
    try:
        layers = get_decoder_layers(model)
    except Exception as e:  # ModelLoadError is a RuntimeError
        raise ValueError(str(e)) from None
    facs = validate_factors(factors, len(layers))
    remove_layer_scaling(model)
    handle = ScalingHandle(model, facs, rotary)
    handle._install()
    return handle


def remove_layer_scaling(model) -> bool:
    """Remove the scaling active on ``model``, if any; return whether there was one."""
    h = getattr(model, "_posbias_scaling", None)
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
    from posbias.utils.io import atomic_write_json

    facs = [float(f) for f in factors]
    validate_factors(facs, len(facs))
    if curve is not None:
        _check_curve(curve, path)
    doc = {"format": FACTORS_FORMAT, "version": FACTORS_VERSION, "model": model, "num_layers": len(facs),
           "factors": facs, "curve": curve, "task": task, "score": score, **extra}
    atomic_write_json(path, doc)
    return doc


def _check_curve(curve: Any, path) -> None:
    from posbias.search.curves import CURVE_KINDS, check_control_points

    if not isinstance(curve, dict) or "type" not in curve or "control_points" not in curve:
        raise FactorsFileError(f"{path}: 'curve' must be an object with 'type' and 'control_points'")
    if curve["type"] not in CURVE_KINDS:
        raise FactorsFileError(f"{path}: unknown curve type {curve['type']!r} (known: {', '.join(CURVE_KINDS)})")
    try:
        check_control_points(curve["control_points"])
    except ValueError as e:
        raise FactorsFileError(f"{path}: bad curve control points: {e}") from None


def load_factors_file(path: str | Path, num_layers: int | None = None) -> dict:
    """Read and validate a factors file.

    With ``num_layers`` the returned dict's ``factors`` fit that layer count: unchanged when it
    matches the file, re-evaluated from the curve otherwise (``FactorsFileError`` if the file has no
    curve). The file's own factors stay under ``saved_factors``.
    """
    path = Path(path)
    if not path.exists():
        raise FactorsFileError(f"factors file not found: {path}")
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise FactorsFileError(f"{path}: not valid JSON ({e.msg}, line {e.lineno})") from None
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
    return doc


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
    from posbias.search.curves import curve_factors

    vals = curve_factors(curve["type"], curve["control_points"], num_layers,
                         round_to_grid=curve.get("round_to_grid"))
    return tuple(float(v) for v in vals)


def apply_factors_file(model, path: str | Path) -> ScalingHandle:
    """Apply a factors file to ``model`` (re-evaluating its curve for another layer count)."""
    from posbias.models.loader import get_decoder_layers

    _rotary_module(model)
    n = len(get_decoder_layers(model))
    doc = load_factors_file(path, num_layers=n)
    return apply_layer_scaling(model, doc["factors"])


def save_patched_model(model, tokenizer, factors_path: str | Path, out: str | Path) -> Path:
    """Write ``model``'s weights + tokenizer + a copy of the factors file to ``out``.

    ``posbias.models.load_model(out)`` reloads it with the scaling active; plain transformers loads
    the (unchanged) weights. The weights are saved without hooks (they change no parameter).
    """
    import shutil

    from posbias.models.loader import get_decoder_layers

    out = Path(out)
    doc = load_factors_file(factors_path, num_layers=len(get_decoder_layers(model)))
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    if tokenizer is not None:
        tokenizer.save_pretrained(out)
    target = out / SAVED_FACTORS_NAME
    if doc["factors"] == doc["saved_factors"]:
        shutil.copyfile(factors_path, target)
    else:  # re-evaluated for this model's depth: store the factors actually used
        extra = {k: v for k, v in doc.items() if k not in ("format", "version", "num_layers", "factors",
                                                             "saved_factors", "curve", "model", "task", "score")}
        save_factors_file(target, factors=doc["factors"], curve=doc.get("curve"), model=doc.get("model"),
                          task=doc.get("task"), score=doc.get("score"), **extra)
    return out
