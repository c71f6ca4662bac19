"""The registry of position-bias methods: ``apply_method(model, name, **options) -> MethodHandle``.

Every method returns a :class:`MethodHandle`; score with ``handle.model(input_ids=...,
attention_mask=..., position_ids=..., past_key_values=..., use_cache=..., logits_to_keep=K)``
(the patched model itself, or a wrapper such as Attention Buckets' parallel-pass model), and call
``handle.remove()`` (or leave the ``with`` block) to restore the model exactly.
"""
from __future__ import annotations

import inspect
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from posbias.bam.config import BamConfig
from posbias.patching.rope_scaling import load_factors_file
from posbias.utils.options import (
    as_list,  # noqa: F401 (methods parse list options with it)
    parse_key_values,
)


@dataclass
class MethodSpec:
    name: str
    factory: Callable[..., "MethodHandle"]
    description: str
    aliases: tuple[str, ...] = ()


METHODS: dict[str, MethodSpec] = {}
PATH_OPTIONS = {"lpes": "factors", "moice": "routers"}  # the option of a method that names a file
_ALIASES: dict[str, str] = {}


class MethodHandle:
    """A method applied to a model.

    Attributes:
        name: the method name.
        model: the callable to score with (the patched model or a wrapper around it).
        base_model: the underlying Hugging Face model.
        options: the options the method was applied with.
        state: method-specific extras (e.g. MoICE routers, Ms-PoE head ratios).
        shared_prefill: whether questions scored against one shared context's cache get exactly the
            scores of their own prompts (False for Ms-PoE's per-prompt head order, which is taken at
            the end of whatever was prefilled): scorers fall back to one prompt per question.
    """

    def __init__(self, name: str, base_model, model=None, remove_fn: Callable[[], None] | None = None,
                 options: dict | None = None, state: dict | None = None, shared_prefill: bool = True):
        self.name = name
        self.shared_prefill = shared_prefill
        self.base_model = base_model
        self.model = model if model is not None else base_model
        self.options = dict(options or {})
        self.state = dict(state or {})
        self._remove_fn = remove_fn
        self.removed = False

    def remove(self) -> None:
        """Undo the method (idempotent)."""
        if not self.removed and self._remove_fn is not None:
            self._remove_fn()
        self.removed = True

    def __enter__(self) -> "MethodHandle":
        return self

    def __exit__(self, *exc) -> None:
        self.remove()

    def __repr__(self) -> str:
        return f"MethodHandle({self.name!r}, options={self.options}, removed={self.removed})"


def register_method(name: str, description: str, aliases: tuple[str, ...] = ()):
    """Decorator: register ``factory(model, **options) -> MethodHandle`` under ``name``."""

    def deco(factory):
        METHODS[name] = MethodSpec(name, factory, description, aliases)
        for a in (name, *aliases):
            _ALIASES[_norm(a)] = name
        return factory

    return deco


def _norm(name: str) -> str:
    return name.strip().lower().replace("_", "-")


def resolve_method(name: str) -> MethodSpec:
    key = _ALIASES.get(_norm(str(name)))
    if key is None:
        raise ValueError(f"unknown method {name!r}; known methods: {', '.join(sorted(METHODS))}")
    return METHODS[key]


def method_options(name: str) -> dict[str, Any]:
    """The options a method accepts, with their defaults."""
    spec = resolve_method(name)
    params = list(inspect.signature(spec.factory).parameters.values())[1:]
    return {p.name: (None if p.default is inspect.Parameter.empty else p.default) for p in params
            if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)}


def check_option_names(name: str, options: dict) -> MethodSpec:
    """The spec of method ``name``; :class:`ValueError` for an unknown name or option name."""
    spec = resolve_method(name)
    allowed = method_options(spec.name)
    unknown = sorted(set(options) - set(allowed))
    if unknown:
        raise ValueError(f"method {spec.name!r} has no option(s) {', '.join(unknown)}; "
                         f"options: {', '.join(allowed) or '(none)'}")
    return spec


def check_method_fits(model, method: str) -> None:
    """:class:`ValueError` (one line) for a RoPE method on a posbias-trained (BAM) model, which has no rotary
    embeddings to rescale: only ``none`` applies there."""
    config = getattr(model, "config", None)
    if method == "none" or getattr(config, "model_type", None) != BamConfig.model_type:
        return
    raise ValueError(f"method {method!r} rescales a RoPE model's rotary embeddings; this is a posbias-trained "
                     f"BAM model (positional scheme {getattr(config, 'pe', '?')}) without them: evaluate it with "
                     "method none")


def check_method(name: str, options: dict[str, Any]) -> None:
    """What can be checked of a method without a model: its name, its option names, the files its
    options name, and (lpes) that its factors file is valid."""
    if name == "none" and not options:
        return

    spec = check_option_names(name, options)
    key = PATH_OPTIONS.get(spec.name)
    if spec.name == "lpes" and options.get(key) is None:
        raise ValueError("method lpes needs its factors file (from posbias search): --factors PATH")
    if key and options.get(key) is not None and not Path(str(options[key])).expanduser().exists():
        raise ValueError(f"{spec.name}: {key} {options[key]} does not exist")
    if spec.name == "lpes":
        load_factors_file(Path(str(options[key])).expanduser())


def apply_method(model, name: str, **options) -> MethodHandle:
    """Apply method ``name`` to ``model``; unknown names / options raise :class:`ValueError`."""
    spec = check_option_names(name, options)
    check_method_fits(model, spec.name)  # a posbias-trained (BAM) model has no RoPE to rescale
    handle = spec.factory(model, **options)
    handle.name = spec.name
    return handle


def split_variant(label: str) -> tuple[str, dict[str, Any]]:
    """A method variant ``name@key=value@key=value`` -> ``(name, {key: value, ...})``.

    ``"ms-poe@r_min=1.0@r_max=1.5"`` -> ``("ms-poe", {"r_min": 1.0, "r_max": 1.5})``; a plain name
    gives ``(name, {})``. Lets a comparison hold one method at several settings side by side (the
    label names its folder and its table row); the option names are checked against the method.
    List values cannot be written here (the method list is comma-separated): give them through
    ``posbias tune``'s settings file."""

    name, *pairs = str(label).split("@")
    if not name or any(not p for p in pairs):
        raise ValueError(f"method variant {label!r}: write name@key=value@key=value")
    options = parse_key_values(pairs, "methods")
    check_option_names(name, options)
    return name, options


def variant_options(label: str, options_by_name: dict[str, dict]) -> tuple[str, dict[str, Any]]:
    """A method list entry (name or ``name@key=value@...``) -> its method name and options: the
    options given for that method name, overridden by the variant's own."""
    name, variant = split_variant(label)
    return name, {**options_by_name.get(name, {}), **variant}


# models a method has marked prompt-dependent (held weakly: a model leaves the set when it is freed)
_PROMPT_DEPENDENT: weakref.WeakSet = weakref.WeakSet()


def mark_prompt_dependent(model, dependent: bool = True) -> None:
    """Mark ``model`` as needing each prompt prefilled alone (or clear the mark): a method whose
    behaviour depends on where the prompt ends (Ms-PoE's head order) marks it while applied."""
    if dependent:
        _PROMPT_DEPENDENT.add(model)
    else:
        _PROMPT_DEPENDENT.discard(model)


def prompt_dependent(model) -> bool:
    """True when ``model`` (or the model a wrapper scores with) must see each prompt prefilled alone
    (:func:`mark_prompt_dependent`); every scorer then prefills prompts alone."""
    return model in _PROMPT_DEPENDENT


def as_choice(value, choices, name: str) -> str:
    """``value`` if it is one of ``choices``, else a :class:`ValueError` listing them."""
    if value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(map(str, choices))}, got {value!r}")
    return value


def as_layer_indices(value, n_layers: int, name: str) -> list[int]:
    """Sorted distinct decoder-layer indices from a list or ``"1,2"``, each in ``0..n_layers - 1``."""
    layers = sorted(set(as_list(value, int, name)))
    bad = [i for i in layers if not 0 <= i < n_layers]
    if bad:
        raise ValueError(f"{name}: layer indices {bad} out of range 0..{n_layers - 1}")
    return layers


def as_bool(value, name: str = "option") -> bool:
    """A bool option (``True`` / ``False``, or 0 / 1 as parsed from ``key=value``); anything else is refused."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    raise ValueError(f"{name} must be true or false, got {value!r}")


@register_method("none", "no change (baseline)", aliases=("baseline", "identity"))
def _none(model) -> MethodHandle:
    return MethodHandle("none", model)


__all__ = ["METHODS", "MethodHandle", "MethodSpec", "apply_method", "check_method", "check_method_fits",
           "check_option_names", "method_options",
           "register_method", "resolve_method", "split_variant", "variant_options", "as_list"]
