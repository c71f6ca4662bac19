"""Shared machinery for methods that rotate queries and keys themselves (Ms-PoE, MoICE).

How it works, for each patched decoder layer:

* the attention module's ``forward`` is wrapped so that it receives *identity* position
  embeddings (cos = 1, sin = 0): the module still projects and normalises q / k / v itself
  (architecture details such as Qwen3's q/k norms stay in Hugging Face's code), but RoPE becomes a
  no-op, so the KV cache holds **un-rotated** keys;
* the module gets a private copy of the config whose ``_attn_implementation`` names a function
  registered in transformers' ``AttentionInterface``; that function dispatches to the method's own
  ``attention(module, query, key, value, mask, scaling, native=..., **kwargs)``, which rotates q and
  k as it likes (per head, per base, ...) and computes the attention with ``native``, the function
  the unpatched module calls (its modeling file's eager attention, SDPA, flash attention, ...;
  :func:`attend_as_model`), so an identity setting reproduces the model bit for bit in any dtype.

The model-level config is untouched, so the causal / padding mask is still built in the format of
the model's own implementation (float additive for ``eager``, boolean or ``None`` for ``sdpa``);
:func:`float_mask` accepts all three. ``remove()`` restores the config object and the class
``forward``, so the model is exactly as before.

Positions: RoPE attention depends only on position *differences*, and the real tokens of one row
are contiguous, so key ``j`` of a cache of length ``kv`` sits at ``p_last - (kv - 1 - j)``, where
``p_last`` is the position of the last query (never padding with left padding). The queries are the
last ``q`` keys. ``p_last`` comes from ``position_ids`` when given (so an unpatched-equivalent
configuration reproduces the model bit for bit), else ``kv - 1``.
"""
from __future__ import annotations

import copy
import sys
import weakref
from typing import Callable

import torch
from transformers import AttentionInterface

from posbias.architecture.layers import get_decoder_layers
from posbias.architecture.rope_layout import rope_layout

ATTN_NAME = "posbias_rope_override"


class _Route:
    """Where a patched attention module's attention goes: ``fn`` (the method's) and ``native`` (the
    module's own attention function, which ``fn`` may call)."""

    def __init__(self, fn: Callable, native: Callable):
        self.fn, self.native = fn, native


# Registries keyed by the patched attention module (entries vanish with the module). A route is held
# weakly: the patched module's ``forward`` keeps it alive, so a removed patch leaves nothing behind.
_ROUTES: weakref.WeakKeyDictionary[torch.nn.Module, weakref.ref] = weakref.WeakKeyDictionary()
# the KV cache of each module's current forward call: a weak reference, or None without a cache
_CACHES: weakref.WeakKeyDictionary[torch.nn.Module, weakref.ref | None] = weakref.WeakKeyDictionary()


def _route_of(module) -> _Route | None:
    ref = _ROUTES.get(module)
    return None if ref is None else ref()


def _dispatch(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    route = _route_of(module)
    if route is None:  # pragma: no cover - only reachable if a patch was half-removed
        raise RuntimeError(f"{ATTN_NAME} called on a module that is not patched by posbias.methods")
    return route.fn(module, query, key, value, attention_mask, scaling=scaling, native=route.native, **kwargs)


def native_attention(module, implementation: str) -> Callable:
    """The attention function ``module`` calls unpatched under ``implementation``, chosen as the
    modeling code chooses it: its modeling file's ``eager_attention_forward`` for ``eager``, else
    transformers' registered function (``sdpa``, flash attention, ...)."""


    eager = getattr(sys.modules[type(module).__module__], "eager_attention_forward", None)
    if eager is None:
        raise ValueError(f"{type(module).__name__}: its modeling file has no eager attention function to reproduce")
    return AttentionInterface().get_interface(implementation, eager)


class _KeysPerQueryHead:
    """``module`` as an attention function sees it when the keys / values passed are already one per
    query head (B, H, kv, d): no grouped-query repetition."""

    num_key_value_groups = 1

    def __init__(self, module):
        self._module = module

    def __getattr__(self, name):
        return getattr(self._module, name)


def attend_as_model(native: Callable, module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                    attention_mask, scaling, *, per_query_head: bool = False, **kwargs) -> torch.Tensor:
    """Attention of rotated ``query`` (B, H, q, d) over rotated ``key`` / ``value`` (B, KV, kv, d), or
    (B, H, kv, d) with ``per_query_head``, by the model's own function ``native`` with the model's own
    mask: the same kernel, mask handling and dtype as the unpatched model. Returns (B, q, H, d)."""
    target = _KeysPerQueryHead(module) if per_query_head else module
    kwargs.pop("dropout", None)
    out, _ = native(target, query, key, value, attention_mask, scaling=scaling, dropout=0.0, **kwargs)
    return out


def _ensure_registered() -> None:

    AttentionInterface.register(ATTN_NAME, _dispatch)


# ----------------------------------------------------------------------------- RoPE helpers

def check_self_rotating(model, layers, what: str):
    """The :class:`~posbias.architecture.rope_layout.RopeLayout` of a model whose ``layers`` a method
    re-implements attention for; ``ValueError`` (one line) for a layout or feature it cannot reproduce:
    interleaved or partial rotary, or attention-logit soft-capping (Gemma 2), which SDPA lacks."""

    layout = rope_layout(model)
    layout.require_rotate_half(what, layers)
    cap = getattr(model.config, "attn_logit_softcapping", None)
    if cap:
        raise ValueError(f"{what} computes attention itself and does not reproduce the attention-logit "
                         f"soft-capping ({cap}) of {type(model).__name__}; not supported")
    return layout


def base_inv_freq(inv_freq: torch.Tensor, theta: float, base: float) -> torch.Tensor:
    """``inv_freq`` re-expressed for another RoPE base (exact identity when ``base == theta``).

    For the default RoPE ``inv_freq_i = theta^(-2i/d)``, so ``base^(-2i/d) = inv_freq_i *
    (theta / base)^(2i/d)``; the same multiplier is applied to non-default ``inv_freq`` tensors.
    """
    d = 2 * inv_freq.shape[-1]
    expo = torch.arange(0, d, 2, dtype=torch.float32, device=inv_freq.device) / d
    return inv_freq.float() * (float(theta) / float(base)) ** expo


def cos_sin(positions: torch.Tensor, inv_freq: torch.Tensor, scaling: float, dtype: torch.dtype,
            interleaved: bool = False):
    """cos / sin for ``positions`` (..., L) and ``inv_freq`` (..., d/2), broadcast like HF's rotary:
    frequencies repeated as ``(f, f)`` halves (rotate-half) or ``f0 f0 f1 f1 ...`` (interleaved, Cohere)."""
    freqs = positions[..., None].float() * inv_freq[..., None, :].float()
    emb = torch.repeat_interleave(freqs, 2, dim=-1) if interleaved else torch.cat((freqs, freqs), dim=-1)
    return (emb.cos() * scaling).to(dtype), (emb.sin() * scaling).to(dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Same arithmetic as transformers' ``apply_rotary_pos_emb`` (so ratio 1 is bit-identical)."""
    return (x * cos) + (rotate_half(x) * sin)


def repeat_kv(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    """(B, KV, L, d) -> (B, KV * n_rep, L, d); query head h uses key head h // n_rep (HF layout)."""
    if n_rep == 1:
        return x
    b, kv, length, d = x.shape
    return x[:, :, None].expand(b, kv, n_rep, length, d).reshape(b, kv * n_rep, length, d)


def query_key_positions(query: torch.Tensor, key: torch.Tensor, position_ids: torch.Tensor | None):
    """(q_pos (B, q), k_pos (B, kv)) as float32; see the module docstring."""
    b, q_len, kv_len = query.shape[0], query.shape[2], key.shape[2]
    ar = torch.arange(kv_len, device=query.device, dtype=torch.float32)
    if position_ids is not None and position_ids.shape[-1] == q_len:
        last = position_ids[..., -1:].to(torch.float32)
        if last.dim() == 1:
            last = last[None]
        last = last.expand(b, 1)
    else:
        last = torch.full((b, 1), float(kv_len - 1), device=query.device)
    k_pos = last - (kv_len - 1) + ar[None]
    return k_pos[:, kv_len - q_len:], k_pos


def float_mask(mask, q_len: int, kv_len: int, dtype: torch.dtype, device) -> torch.Tensor | None:
    """Additive float mask (B|1, 1, q, kv) from an eager float mask, an sdpa bool mask, a 2-D (B, kv)
    padding mask (combined with causality) or None (causal)."""
    if mask is None or mask.dim() == 2:
        i = torch.arange(q_len, device=device)[:, None] + (kv_len - q_len)
        j = torch.arange(kv_len, device=device)[None]
        causal = (j <= i)[None, None]  # (1, 1, q, kv): queries are the last q keys
        if mask is None:
            if q_len == 1:
                return None
            mask = causal
        else:  # a 2-D (B, kv) padding mask (1 = attend): padding and causality together
            mask = causal & mask[:, None, None, :kv_len].to(device).bool()
    mask = mask[..., :kv_len]
    if mask.dtype == torch.bool:
        zero = torch.zeros((), dtype=dtype, device=device)
        low = torch.tensor(torch.finfo(dtype).min, dtype=dtype, device=device)
        mask = torch.where(mask, zero, low)
    return mask.to(dtype)


class RotatedKeyCache:
    """Rotated keys of the last call, per ``(layer, tag)``, so a decoding step rotates only its new keys.

    The KV cache holds un-rotated keys; a method whose rotation of a key is fixed once the prompt is
    prefilled (Ms-PoE's per-head ratios, MoICE's expert bases) can keep the rotated keys and extend
    them. A call *continues* the stored keys when it is not a prefill (``q_len < kv``), extends the
    very cache object of the stored call (see :func:`module_cache`), the stored length is exactly
    ``kv - q_len`` and the stored un-rotated keys equal the cache's first ``kv - q_len`` keys
    (``torch.equal``: a beam reorder or row selection that keeps the object and its length, a
    cropped, repeated or other cache is rotated afresh; comparing costs one read of the un-rotated
    keys, far less than rotating them per query head or expert). Memory: one rotated copy per tag of
    the (possibly query-head-expanded) key cache, plus one copy of the un-rotated keys, held until
    that cache is garbage-collected.
    """

    def __init__(self):
        self._store: dict[tuple, tuple] = {}
        self._owners: dict[int, weakref.ref] = {}  # id(cache) -> its weak reference (one per cache)
        self.reused = 0  # calls that rotated only their new keys

    def keys(self, module, tag, key: torch.Tensor, q_len: int,
             rotate_from: Callable[[int], torch.Tensor]) -> torch.Tensor:
        """Rotated keys (B, *, kv, d) for the un-rotated ``key`` (B, KV, kv, d) of ``module``'s call;
        ``rotate_from(start)`` rotates ``key[:, :, start:]`` (B, *, kv - start, d)."""
        kv, cache = key.shape[2], module_cache(module)
        slot = (module.layer_idx, tag)
        prev = self._store.get(slot)
        start = 0
        if prev is not None and q_len < kv and cache is not None:
            rot, seen, owner = prev
            n = seen.shape[2]
            if (owner() is cache and n == kv - q_len and seen.shape[:2] == key.shape[:2]
                    and torch.equal(seen, key[:, :, :n])):
                start = n
                self.reused += 1
        new = rotate_from(start)
        rot = new if start == 0 else torch.cat([prev[0], new], dim=2)
        if cache is None:
            self._store.pop(slot, None)
        else:
            self._store[slot] = (rot, key.clone(), self._owner(cache))
        return rot

    def _owner(self, cache) -> weakref.ref:
        """The weak reference to ``cache``; when the cache is garbage-collected its rotated keys go too."""
        ref = self._owners.get(id(cache))
        if ref is None or ref() is not cache:
            ref = self._owners[id(cache)] = weakref.ref(cache, self._forget)
        return ref

    def _forget(self, ref: weakref.ref) -> None:
        for slot in [slot for slot, stored in self._store.items() if stored[2] is ref]:
            del self._store[slot]
        for key in [key for key, r in self._owners.items() if r is ref]:
            del self._owners[key]

    def clear(self) -> None:
        self._store.clear()
        self._owners.clear()


# ----------------------------------------------------------------------------- the patch

class RopeAttentionPatch:
    """Route the attention of ``layer_indices`` through ``attention_fn`` with un-rotated q / k.

    ``attention_fn(module, query, key, value, attention_mask, scaling=..., **kwargs)`` gets the
    un-rotated query (B, H, q, d), key / value (B, KV, kv, d) from the cache, and must return
    ``(attn_output (B, q, H, d), attn_weights_or_None)`` like transformers' attention functions.
    """

    def __init__(self, model, layer_indices, attention_fn: Callable):
        _ensure_registered()
        self.model = model
        self.layers = get_decoder_layers(model)
        self._saved: list[tuple[torch.nn.Module, object]] = []
        try:
            for i in layer_indices:
                attn = self.layers[i].self_attn
                if _route_of(attn) is not None:
                    raise ValueError(f"layer {i} attention is already patched by another posbias method; "
                                     "remove that handle first")
                native = native_attention(attn, attn.config._attn_implementation)
                self._saved.append((attn, attn.config))
                cfg = copy.copy(attn.config)
                cfg.__dict__["_attn_implementation_internal"] = ATTN_NAME
                attn.config = cfg
                route = _Route(attention_fn, native)
                _ROUTES[attn] = weakref.ref(route)
                attn.forward = _identity_rope_forward(attn, route)
        except Exception:
            self.remove()
            raise

    def remove(self) -> None:
        for attn, cfg in reversed(self._saved):
            attn.config = cfg
            _ROUTES.pop(attn, None)
            _CACHES.pop(attn, None)
            attn.__dict__.pop("forward", None)
        self._saved = []


CACHE_KWARGS = ("cache", "past_key_values", "past_key_value")  # its name across transformers versions


def module_cache(module) -> object | None:
    """The KV cache object of ``module``'s current forward call (None without a cache)."""
    ref = _CACHES.get(module)
    return None if ref is None else ref()


def _remember_cache(attn, args, kwargs) -> None:
    cache = next((kwargs[k] for k in CACHE_KWARGS if kwargs.get(k) is not None), None)
    if cache is None and len(args) > 3:
        cache = args[3]
    try:
        _CACHES[attn] = None if cache is None else weakref.ref(cache)
    except TypeError:  # an object without weak references: never reuse rotated keys
        _CACHES[attn] = None


def _identity_rope_forward(attn: torch.nn.Module, route: _Route):
    """``attn``'s forward with identity RoPE (cos 1, sin 0); it holds ``route`` for as long as the patch."""
    orig = type(attn).forward.__get__(attn)

    def forward(*args, **kwargs):
        _remember_cache(attn, args, kwargs)
        if "position_embeddings" in kwargs and kwargs["position_embeddings"] is not None:
            cos, sin = kwargs["position_embeddings"]
            kwargs["position_embeddings"] = (torch.ones_like(cos), torch.zeros_like(sin))
        elif len(args) >= 2 and args[1] is not None:
            cos, sin = args[1]
            args = (args[0], (torch.ones_like(cos), torch.zeros_like(sin)), *args[2:])
        return orig(*args, **kwargs)

    forward.route = route  # the patched module holds its forward, and with it the route
    return forward
