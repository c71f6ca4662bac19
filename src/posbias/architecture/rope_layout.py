"""Where each decoder layer of a Hugging Face model gets its rotary position embedding from.

One description of a model's RoPE layout, used by the per-layer scaling (LPES / PI), by every
inference-time method that rotates queries and keys itself (Ms-PoE, MoICE, Attention Buckets) and by
the checks that refuse a model. Per decoder layer it records:

* ``layer_type``: the argument the shared rotary module takes for this layer (Gemma 3 keeps one
  inverse-frequency buffer per layer type, ``sliding_attention`` with theta 1e4 and
  ``full_attention`` with theta 1e6, and the model passes each layer the ``(cos, sin)`` of its own
  type); ``None`` when one table serves every layer;
* ``theta`` (RoPE base), ``rope_type`` (default, linear, llama3, yarn, dynamic, longrope, ...) and
  the module's ``attention_scaling``;
* ``rotary_dim`` / ``head_dim``: partial rotary (Phi-3 with ``partial_rotary_factor``) rotates only
  the first ``rotary_dim`` dims of each head;
* ``interleaved``: Cohere rotates pairs ``(2i, 2i+1)`` (``repeat_interleave`` of the frequencies),
  the Llama family pairs ``(i, i + d/2)`` (rotate-half).

The layout is read off the model itself: the rotary module is called once at position 1 and the
pattern of its ``cos`` tells the rotated width and the pairing, so no per-architecture table has to
be kept in sync with transformers.

:meth:`RopeLayout.cos_sin` feeds the model's own rotary module the positions ``m / s`` (as floats):
that is linear position interpolation in whatever layout and rope type the model has (RoPE angles are
``position x inv_freq``), and with ``s = 1`` it is exactly what the model computes itself.
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass
from functools import cached_property

import torch

from posbias.architecture.layers import ModelLoadError, get_decoder_layers

#: rope types whose rotary module changes its frequencies with the sequence length it sees
LENGTH_DEPENDENT_ROPE_TYPES = ("dynamic", "longrope")


class RopeLayoutError(ValueError):
    """A model whose RoPE cannot be described (and so must not be patched)."""


@dataclass(frozen=True)
class LayerRope:
    """The rotary embedding one decoder layer uses (see the module docstring)."""

    layer: int
    layer_type: str | None
    rope_type: str
    theta: float
    attention_scaling: float
    rotary_dim: int
    head_dim: int
    interleaved: bool

    @property
    def rotate_half_full_head(self) -> bool:
        """True for the Llama layout: rotate-half pairing over the whole head."""
        return not self.interleaved and self.rotary_dim == self.head_dim

    def describe(self) -> str:
        kind = "interleaved" if self.interleaved else "rotate-half"
        part = "" if self.rotary_dim == self.head_dim else f", partial {self.rotary_dim}/{self.head_dim} dims"
        typ = f"{self.layer_type}: " if self.layer_type else ""
        return f"{typ}theta {self.theta:g}, {self.rope_type}, {kind}{part}"


class RopeLayout:
    """The RoPE layout of a model: its shared rotary module and one :class:`LayerRope` per layer."""

    def __init__(self, model, rotary: torch.nn.Module, layers: tuple[LayerRope, ...]):
        self.model = model
        self.rotary = rotary
        self.layers = layers

    @cached_property
    def takes_layer_type(self) -> bool:
        return "layer_type" in inspect.signature(self.rotary.forward).parameters

    @property
    def layer_types(self) -> list[str | None]:
        """The distinct layer types, in order of first use (``[None]`` for a single table)."""
        return list(dict.fromkeys(lr.layer_type for lr in self.layers))

    @property
    def thetas(self) -> dict[str | None, float]:
        return {lr.layer_type: lr.theta for lr in self.layers}

    def length_dependent(self, layer_type: str | None = None) -> bool:
        """Whether the rotary module adapts its frequencies to the positions it is given."""
        rope_type = next(lr.rope_type for lr in self.layers if lr.layer_type == layer_type)
        return any(t in rope_type for t in LENGTH_DEPENDENT_ROPE_TYPES)

    def inv_freq(self, layer_type: str | None = None) -> torch.Tensor:
        """The live inverse frequencies (rotary_dim / 2,) of ``layer_type`` (dynamic rope may replace them)."""
        return _buffer(self.rotary, "inv_freq", layer_type)

    def attention_scaling(self, layer_type: str | None = None) -> float:
        return float(_attr(self.rotary, "attention_scaling", layer_type, 1.0))

    def cos_sin(self, positions: torch.Tensor, like: torch.Tensor, layer_type: str | None = None):
        """``(cos, sin)`` of shape (B, L, rotary_dim) from the model's own rotary module.

        ``positions`` (B, L) may be floats (``m / s`` for position interpolation).
        """
        if self.takes_layer_type:
            return self.rotary(like, positions, layer_type)
        return self.rotary(like, positions)

    def require_rotate_half(self, what: str, layers=None) -> None:
        """Raise :class:`RopeLayoutError` unless the given layers use the Llama layout.

        For methods that rotate queries and keys themselves with rotate-half over the whole head.
        """
        idx = range(len(self.layers)) if layers is None else layers
        bad = [self.layers[i] for i in idx if not self.layers[i].rotate_half_full_head]
        if bad:
            raise RopeLayoutError(
                f"{what} rotates q and k itself with rotate-half over the whole head, but "
                f"{type(self.model).__name__} layer {bad[0].layer} uses {bad[0].describe()}; not supported"
            )

    def describe(self) -> str:
        seen = dict.fromkeys(lr.describe() for lr in self.layers)
        return f"{type(self.model).__name__}, {len(self.layers)} layers: " + "; ".join(seen)


def _attr(module, name: str, layer_type: str | None, default=None):
    if layer_type is not None and hasattr(module, f"{layer_type}_{name}"):
        return getattr(module, f"{layer_type}_{name}")
    return getattr(module, name, default)


def _buffer(module, name: str, layer_type: str | None) -> torch.Tensor:
    value = _attr(module, name, layer_type)
    if not isinstance(value, torch.Tensor):
        where = f"{layer_type}_{name}" if layer_type else name
        raise RopeLayoutError(f"rotary module {type(module).__name__} has no buffer {where!r}")
    return value


def is_rotary_module(name: str, module: torch.nn.Module) -> bool:
    """A ``*rotary_emb`` module with an ``inv_freq`` buffer (or per-layer-type ``<type>_inv_freq``)."""
    if not name.endswith("rotary_emb"):
        return False
    return any(b == "inv_freq" or (b.endswith("_inv_freq") and not b.endswith("original_inv_freq"))
               for b, _ in module.named_buffers(recurse=False))


def _rope_parameters(config, layer_type: str | None) -> dict:
    params = getattr(config, "rope_parameters", None) or {}
    if layer_type is not None and isinstance(params.get(layer_type), dict):
        return params[layer_type]
    return params


def _theta(config, layer_type: str | None) -> float:
    params = _rope_parameters(config, layer_type)
    theta = params.get("rope_theta", getattr(config, "rope_theta", None))
    if theta is None:
        raise RopeLayoutError(f"{config.model_type}: no rope_theta in the config")
    return float(theta)


def _head_dim(config) -> int:
    return int(getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads)


def _probe(layout: RopeLayout, layer_type: str | None) -> tuple[int, bool]:
    """(rotary_dim, interleaved) read off ``cos`` at position 1."""
    inv = layout.inv_freq(layer_type)
    like = torch.zeros(1, dtype=torch.float32, device=inv.device)
    with torch.no_grad():
        cos, _ = layout.cos_sin(torch.ones(1, 1, device=inv.device), like, layer_type)
    c = cos.reshape(-1).float()
    d = c.numel()
    half = torch.equal(c[: d // 2], c[d // 2:])
    pairs = d % 2 == 0 and torch.equal(c[0::2], c[1::2])
    if half == pairs and d > 2:
        raise RopeLayoutError(f"cannot tell the rotary pairing of {type(layout.model).__name__} from its cos table")
    return d, pairs and not half


def shared_rotary_module(model) -> torch.nn.Module:
    """The model's one rotary module (``model.model.rotary_emb``); :class:`RopeLayoutError` otherwise."""
    mods = [m for name, m in model.named_modules() if is_rotary_module(name, m)]
    if not mods:
        raise RopeLayoutError(
            f"{type(model).__name__} ({model.config.model_type}) has no rotary position embeddings; "
            "posbias patches RoPE models only"
        )
    base = getattr(model, "model", model)
    shared = getattr(base, "rotary_emb", None)
    if shared is not None and any(shared is m for m in mods):
        return shared
    if len(mods) > 1:
        raise RopeLayoutError(
            f"{type(model).__name__} has {len(mods)} rotary modules and none at model.model.rotary_emb; "
            "posbias supports models with one shared rotary module"
        )
    return mods[0]


def rope_layout(model, layers=None) -> RopeLayout:
    """Describe ``model``'s RoPE per decoder layer; :class:`RopeLayoutError` for a model that cannot be
    patched (no rotary module, several unshared ones, decoder layers that take no
    ``position_embeddings``, an unreadable pairing)."""
    rotary = shared_rotary_module(model)
    if layers is None:

        try:
            layers = get_decoder_layers(model)
        except ModelLoadError as e:
            raise RopeLayoutError(str(e)) from None
    params = inspect.signature(type(layers[0]).forward).parameters
    if "position_embeddings" not in params:
        raise RopeLayoutError(
            f"{type(layers[0]).__name__} takes no 'position_embeddings'; per-layer RoPE scaling needs "
            "transformers 5.x decoder layers that receive (cos, sin) from the model"
        )
    cfg = model.config
    layout = RopeLayout(model, rotary, ())
    types = list(getattr(cfg, "layer_types", None) or [None] * len(layers))
    if not layout.takes_layer_type:
        types = [None] * len(layers)
    probed: dict[str | None, tuple[int, bool]] = {}
    out = []
    for i, lt in enumerate(types[: len(layers)]):
        if lt not in probed:
            probed[lt] = _probe(layout, lt)
        rot_dim, inter = probed[lt]
        out.append(LayerRope(
            layer=i, layer_type=lt, rope_type=str(_rope_parameters(cfg, lt).get("rope_type", "default")),
            theta=_theta(cfg, lt), attention_scaling=layout.attention_scaling(lt), rotary_dim=rot_dim,
            head_dim=_head_dim(cfg), interleaved=inter))
    layout.layers = tuple(out)
    return layout
