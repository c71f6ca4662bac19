"""Positional hidden-state scaling (Yu et al. 2024, "Mitigate Position Bias in Large Language Models
via Scaling a Single Dimension", arXiv 2406.02536).

The paper finds that a few dimensions of the residual stream carry absolute position: averaged over
a corpus, their value is a smooth monotone function of the token's position in most layers
(:mod:`posbias.methods.positional_dims` finds them). Scaling such a dimension in the attention input
of a band of middle layers, for the last token(s) of the prompt, changes where the question attends
and lifts retrieval from the middle of the context.

What the reference implementation (``PositionalHidden/PositionalHidden``, its patched Llama / Gemma /
MPT attention and ``use_model.py``) does with its six config keys, and what this module does:

* ``dims``: indices of hidden dimensions (of the *normalised* attention input, i.e. after the layer's
  ``input_layernorm``) to scale. Published: Llama-2-7B 2393, Qwen1.5-7B 1081, Gemma-7B 1665.
* ``layers``: the decoder layers where the scaling acts; every published config uses 10..25 (of 32
  or 28 layers). Here the default is the same band expressed as a fraction of depth
  (``round(10 / 32 L) .. round(26 / 32 L) - 1``), or explicit ``layers``.
* ``factor``: the multiplier of those dims (published: 0 for Qwen / Gemma, -1 for Llama-2-7B;
  their search validates with 0).
* ``skip_first``: tokens left unscaled at the start. The reference slices the current forward's
  chunk (``hidden[:, skip_first:, dims]``), so in a one-token decoding step ``skip_first > 0``
  scales nothing; here it counts absolute positions (``position_ids < skip_first`` stay
  unscaled), the same at prefill and a decoding step. Every published config uses 0.
* ``last_recompute_tokens`` (``R``): in a prefill, the attention output of every token is the
  model's own except the last ``R``, which is recomputed with the scaled query against the scaled
  keys of all tokens. In a one-token decoding step (``q_len == 1`` with a cache) the token is always
  recomputed. The KV cache of a patched layer holds the *scaled* keys (all tokens from
  ``skip_first``), so later steps attend to scaled keys. Their dimension validation recomputes
  ``len(answer) + 1`` tokens of ``prompt + answer`` in one forward: the last prompt token and every
  answer token.
* ``change_value``: when true the values are also projected from the scaled hidden states (and
  cached so); when false (every published config) values are the model's own.

Mechanics here (transformers 5.x, every layout whose attention module takes the normalised hidden
states and projects q / k / v itself: Llama, Qwen2 with grouped-query attention, Gemma 3 with its
q / k norms and sliding layers, Mistral, Qwen3):

* a forward pre-hook on each patched attention module replaces ``hidden_states`` by the scaled copy,
  so the module's own code projects, normalises, rotates, caches and attends with the scaled q / k;
  with ``change_value=False`` a forward hook on ``v_proj`` returns the projection of the unscaled
  input instead;
* in a prefill (no cache, or an empty one) with more than ``R`` tokens the module is also called
  once on the unscaled input without a cache, and a forward hook keeps that output for every row
  but the last ``R`` (rows are independent through ``o_proj``). Cost: the patched layers' attention
  twice at prefill;
* a call that extends a non-empty cache (a decoding step, or an answer fed through the cache by the
  scorers) recomputes every row: that is the reference's decoding step, and for a multi-token
  continuation the same as feeding its tokens one at a time (so teacher-forced answer scores equal
  what greedy decoding sees).

Where the scaled rows are depends on where the prompt ends, so the model is marked prompt-dependent
(:func:`posbias.methods.registry.mark_prompt_dependent`): scorers prefill each prompt alone and feed
its answer through the cache, and a shared-context scorer falls back to one prompt per question
(``handle.shared_prefill`` is false). As in the reference, generation *without* a cache recomputes
only the last ``R`` rows of each re-run, so it differs from cached generation after the first
token.

``factor == 1`` or no ``dims`` installs no hook: the model is bit-identical.
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Sequence

import torch

from posbias.architecture.layers import get_decoder_layers
from posbias.methods.registry import (
    MethodHandle,
    as_bool,
    as_layer_indices,
    as_list,
    mark_prompt_dependent,
    register_method,
)
from posbias.utils.options import check_int

#: the reference band, layers 10..25 of a 32-layer model, as fractions of depth
REFERENCE_BAND = (10 / 32, 26 / 32)


@dataclass(frozen=True)
class HiddenScaleConfig:
    """The reference's ``hidden_scale_config`` (see the module docstring for each key)."""

    dims: tuple[int, ...]
    layers: tuple[int, ...]
    factor: float = 0.0
    skip_first: int = 0
    last_recompute_tokens: int = 1
    change_value: bool = False

    @property
    def identity(self) -> bool:
        return not self.dims or not self.layers or self.factor == 1.0


def reference_band(n_layers: int, band: Sequence[float] = REFERENCE_BAND) -> list[int]:
    """Layers ``round(lo L) .. round(hi L) - 1`` of a band ``(lo, hi)`` of depth fractions (default the
    reference's layers 10..25 of 32), at least one layer."""
    lo = round(band[0] * n_layers)
    hi = max(lo + 1, round(band[1] * n_layers))
    return list(range(min(lo, n_layers - 1), min(hi, n_layers)))


def band_layers(band, n_layers: int) -> list[int]:
    """The layers of ``band`` (``[lo, hi]`` or ``"lo,hi"``, fractions of depth with 0 <= lo < hi <= 1)."""
    b = as_list(band, float, "positional-hidden: band")
    if len(b) != 2 or not 0 <= b[0] < b[1] <= 1:
        raise ValueError(f"positional-hidden: band must be two depth fractions lo,hi with 0 <= lo < hi <= 1, got {b}")
    return reference_band(n_layers, b)


def scale_hidden(hidden: torch.Tensor, cfg: HiddenScaleConfig, position_ids: torch.Tensor | None = None,
                 past: int = 0, dims: torch.Tensor | None = None) -> torch.Tensor:
    """A copy of ``hidden`` (B, q, D) with ``cfg.dims`` multiplied by ``cfg.factor`` at positions >=
    ``cfg.skip_first`` (``position_ids`` (B|1, q); default ``past .. past + q - 1``). ``dims``: the
    indices as a long tensor on ``hidden``'s device, when the caller keeps one."""
    out = hidden.clone()
    if dims is None:
        dims = torch.tensor(cfg.dims, dtype=torch.long, device=hidden.device)
    scaled = out[..., dims] * cfg.factor
    if cfg.skip_first > 0:
        if position_ids is None:
            position_ids = torch.arange(past, past + hidden.shape[1], device=hidden.device)[None]
        keep = (position_ids.to(hidden.device) < cfg.skip_first)[..., None]  # (B|1, q, 1)
        scaled = torch.where(keep, out[..., dims], scaled)
    out[..., dims] = scaled
    return out


#: the names under which transformers passes an attention module its KV cache
CACHE_KWARGS = ("cache", "past_key_values", "past_key_value")


def _cache_of(kwargs: dict):
    for name in CACHE_KWARGS:
        if kwargs.get(name) is not None:
            return kwargs[name]
    return None


class PositionalHiddenScaling:
    """The hooks of one application; state (the pending unscaled outputs) lives here, keyed by layer."""

    def __init__(self, model, cfg: HiddenScaleConfig):
        self.model, self.cfg = model, cfg
        self._plain_out: dict[int, torch.Tensor] = {}  # layer -> unscaled attention output (B, q, D)
        self._plain_in: dict[int, torch.Tensor] = {}  # layer -> unscaled hidden (B, q, D) for v_proj
        self._dims: dict[torch.device, torch.Tensor] = {}  # cfg.dims as a long tensor, per device
        self._hooks: list = []
        layers = get_decoder_layers(model)
        try:
            for i in cfg.layers:
                self._install(i, layers[i].self_attn)
        except Exception:
            self.remove()
            raise

    def _install(self, layer: int, attn: torch.nn.Module) -> None:
        for name in ("q_proj", "k_proj", "v_proj"):
            if not isinstance(getattr(attn, name, None), torch.nn.Module):
                raise ValueError(f"positional-hidden: layer {layer} attention ({type(attn).__name__}) has no "
                                 f"separate {name}; only attention with q_proj / k_proj / v_proj is supported")
        self._hooks.append(attn.register_forward_pre_hook(self._pre_hook(layer), with_kwargs=True))
        self._hooks.append(attn.register_forward_hook(self._post_hook(layer), with_kwargs=True))
        if not self.cfg.change_value:
            self._hooks.append(attn.v_proj.register_forward_hook(self._value_hook(layer)))

    def scaled(self, hidden: torch.Tensor, position_ids: torch.Tensor | None, past: int) -> torch.Tensor:
        dims = self._dims.get(hidden.device)
        if dims is None:  # made once per device, not in every attention call
            dims = self._dims[hidden.device] = torch.tensor(self.cfg.dims, dtype=torch.long, device=hidden.device)
        return scale_hidden(hidden, self.cfg, position_ids, past, dims)

    def _pre_hook(self, layer: int):
        def hook(module, args, kwargs):
            hidden = kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]
            rest = args[1:] if "hidden_states" not in kwargs else args
            cache = _cache_of(kwargs)
            past = 0 if cache is None else int(cache.get_seq_length(layer))
            q_len = hidden.shape[1]
            self._plain_out.pop(layer, None)  # nothing left over from a call that raised
            self._plain_in.pop(layer, None)
            if past == 0 and q_len > self.cfg.last_recompute_tokens:  # prefill: most rows stay the model's own
                plain_kwargs = {k: v for k, v in kwargs.items() if k not in ("hidden_states", *CACHE_KWARGS)}
                self._plain_out[layer] = module.forward(hidden, *rest, **plain_kwargs)[0]
            self._plain_in[layer] = hidden
            new = self.scaled(hidden, kwargs.get("position_ids"), past)
            if "hidden_states" in kwargs:
                return args, {**kwargs, "hidden_states": new}
            return (new, *args[1:]), kwargs

        return hook

    def _post_hook(self, layer: int):
        def hook(module, args, kwargs, output):
            self._plain_in.pop(layer, None)
            plain = self._plain_out.pop(layer, None)
            if plain is None:
                return output
            r = self.cfg.last_recompute_tokens
            mixed = torch.cat([plain[:, :-r], output[0][:, -r:]], dim=1)
            return (mixed, *output[1:])

        return hook

    def _value_hook(self, layer: int):
        def hook(module, args, output):
            plain = self._plain_in.get(layer)
            if plain is None or args[0] is plain:  # the unscaled call itself
                return output
            return module.forward(plain)

        return hook

    def remove(self) -> None:
        for h in self._hooks:
            h.remove()
        self._hooks = []
        self._plain_out.clear()
        self._plain_in.clear()


def dims_from_file(path, top: int = 1) -> list[int]:
    """The first ``top`` dimensions of a ``posbias positional-dims`` JSON (``{"dims": [{"dim": ..}, ..]}``)."""
    p = Path(str(path)).expanduser()
    if not p.is_file():
        raise ValueError(f"positional-hidden: dims file {p} does not exist (write one with posbias positional-dims)")
    try:
        doc = json.loads(p.read_text(encoding="utf-8"))
        dims = [int(d["dim"]) for d in doc["dims"]]
    except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError, ValueError):
        raise ValueError(f"positional-hidden: {p} is not a positional-dims JSON ({{'dims': [{{'dim': ...}}]}})") \
            from None
    if len(dims) < top:
        raise ValueError(f"positional-hidden: {p} lists {len(dims)} dimensions, dims_top={top} asked")
    return dims[:top]


def build_config(model, dims=None, layers=None, factor=0.0, skip_first=0, last_recompute_tokens=1,
                 change_value=False, dims_file=None, dims_top=1, band=None) -> HiddenScaleConfig:
    """Validated :class:`HiddenScaleConfig` for ``model`` (each bad option a one-line ``ValueError``)."""
    n_layers = len(get_decoder_layers(model))
    hidden = int(model.config.hidden_size)
    if dims is not None and dims_file is not None:
        raise ValueError("positional-hidden: give dims or dims_file, not both")
    if dims_file is not None:
        dims = dims_from_file(dims_file, check_int("positional-hidden: dims_top", dims_top))
    dims = sorted(set(as_list(dims, int, "positional-hidden: dims") or []))
    bad = [d for d in dims if not 0 <= d < hidden]
    if bad:
        raise ValueError(f"positional-hidden: dims {bad} out of range 0..{hidden - 1} (hidden size {hidden})")
    if layers is not None and band is not None:
        raise ValueError("positional-hidden: give layers or band, not both")
    if layers is not None:
        layers = as_layer_indices(layers, n_layers, "positional-hidden: layers")
    else:
        layers = band_layers(REFERENCE_BAND if band is None else band, n_layers)
    try:
        factor = float(factor)
    except (TypeError, ValueError):
        raise ValueError(f"positional-hidden: factor must be a number, got {factor!r}") from None
    if not math.isfinite(factor):
        raise ValueError(f"positional-hidden: factor must be finite, got {factor}")
    return HiddenScaleConfig(
        dims=tuple(dims), layers=tuple(layers), factor=factor,
        skip_first=check_int("positional-hidden: skip_first", skip_first, minimum=0),
        last_recompute_tokens=check_int("positional-hidden: last_recompute_tokens", last_recompute_tokens),
        change_value=as_bool(change_value, "positional-hidden: change_value"))


@register_method("positional-hidden", "positional hidden-state scaling (Yu et al. 2024): scale hidden dims of "
                                      "the last tokens' attention in a layer band (options dims / dims_file, "
                                      "layers / band, factor, skip_first, last_recompute_tokens, change_value)",
                 aliases=("positional_hidden", "hidden-scale"))
def apply_positional_hidden(model, dims: Sequence[int] | None = None, layers: Sequence[int] | None = None,
                            factor: float = 0.0, skip_first: int = 0, last_recompute_tokens: int = 1,
                            change_value: bool = False, dims_file: str | None = None,
                            dims_top: int = 1, band: Sequence[float] | None = None) -> MethodHandle:
    """Apply positional hidden-state scaling (the module docstring has each option).

    Args:
        dims: hidden dimensions to scale (list or ``"1,2"``).
        dims_file: take them from a ``posbias positional-dims`` JSON instead (the first ``dims_top``).
        layers: decoder layers (default: the reference band 10..25 of 32, scaled to the depth).
        band: the layers as depth fractions ``[lo, hi]`` instead (``[0.3125, 0.8125]`` = the reference's).
    """
    cfg = build_config(model, dims, layers, factor, skip_first, last_recompute_tokens, change_value,
                       dims_file, dims_top, band)
    opts = asdict(cfg)
    opts = {**opts, "dims": list(cfg.dims), "layers": list(cfg.layers)}
    if cfg.identity:
        return MethodHandle("positional-hidden", model, options=opts)
    state = PositionalHiddenScaling(model, cfg)
    mark_prompt_dependent(model)

    def remove():
        state.remove()
        mark_prompt_dependent(model, False)

    return MethodHandle("positional-hidden", model, remove_fn=remove, options=opts, state={"scaling": state},
                        shared_prefill=False)


TUNE_FACTORS = (0.0, -1.0, 0.5)  # 0: the published Qwen / Gemma setting, -1: Llama-2's
TUNE_BANDS = (REFERENCE_BAND, (0.5, 1.0))


def tune_grid(base: dict, top: int = 3) -> list[dict]:
    """dimension x band x factor settings for ``posbias tune``: each of the first ``top`` dimensions of
    ``base["dims_file"]`` (or each of ``base["dims"]``) alone; the first setting is the published one
    (the best-ranked dimension, the reference band, factor 0), the last the unchanged model (factor 1),
    so the table shows what the model scores on the same split."""
    if base.get("dims_file") is not None:
        p = Path(str(base["dims_file"])).expanduser()
        n = len(json.loads(p.read_text(encoding="utf-8")).get("dims", [])) if p.is_file() else top
        candidates = dims_from_file(p, min(top, n))
    else:
        candidates = as_list(base.get("dims"), int, "positional-hidden: dims") or []
    if not candidates:
        raise ValueError("tune: positional-hidden needs candidate dimensions: --dims-file (from posbias "
                         "positional-dims) or dims in the base options")
    grid = [{"dims": [d], "dims_file": None, "band": list(b), "factor": f}
            for d in candidates for b in TUNE_BANDS for f in TUNE_FACTORS]
    return grid + [{**grid[0], "factor": 1.0}]
