"""Ms-PoE (Found in the Middle, Zhang et al. 2024): per-head position interpolation.

In every patched layer, query head ``h`` sees positions ``m / r_h``; the ratios form the grid
``r_i = r_min + (r_max - r_min) * i / H`` (i = 0..H-1, so 1.2 .. <1.8 by default).

Which head gets which ratio (``order``):

* ``"score"`` (default): at prefill the position-awareness score of every head is computed from the
  attention of the last query token: the fraction of (non-padding) keys whose attention exceeds 3x
  the row mean. Scores and ratios are per batch row, so a batched prompt gets the same ratios as
  alone. The ratios are then kept for the cached decoding steps of that prompt (recomputed at the
  next prefill, i.e. any call that does not extend a cache). Scorers prefill each prompt alone
  (the model is marked prompt-dependent), so a gold answer never enters the order.

  Two choices, each selectable (see ``docs/methods/baselines-reference.md`` for what the reference code does):

  - ``score_rope="unrotated"`` (default, as the reference code: the statistic is taken on q / k
    before RoPE) or ``"rotated"`` (on the attention the model computes, under its own RoPE);
  - ``mapping="rank"`` (default, the paper's stated intent: the most position-aware head gets the
    smallest ratio ``r_0``, the least aware the largest) or ``"permutation"`` (the reference code:
    the ``argsort`` of the scores used directly as an index, so head ``i`` gets ``r[argsort[i]]``).
* ``"index"``: head ``h`` gets ``r_h`` (static; the incremental = full-recompute property holds).
* explicit ``ratios=[...]`` (one per query head) overrides both.

Grouped-query attention: several query heads share one key head, but with per-query-head ratios
the *key* rotation differs per query head, so keys are expanded to query heads (HF layout: query
head ``h`` reads key head ``h // (H / KV)``) and rotated with the ratio of the query head that
reads them. The cache stores un-rotated keys (see :mod:`posbias.methods.rope_attention`); the rotated,
head-expanded keys are kept between decoding steps (``rotated_cache``, default on), so a step
rotates only its new keys.
"""
from __future__ import annotations

from typing import Sequence

import torch

from posbias.architecture.layers import get_decoder_layers
from posbias.methods import rope_attention as A
from posbias.methods.registry import (
    MethodHandle,
    as_bool,
    as_choice,
    as_layer_indices,
    as_list,
    mark_prompt_dependent,
    register_method,
)
from posbias.utils.options import check_int, check_number


def ratio_grid(num_heads: int, r_min: float, r_max: float) -> torch.Tensor:
    """``r_min + (r_max - r_min) * i / H`` for i = 0..H-1 (the reference formula)."""
    i = torch.arange(num_heads, dtype=torch.float32)
    return r_min + (r_max - r_min) * i / num_heads


MAPPINGS = ("rank", "permutation")
SCORE_ROPE = ("unrotated", "rotated")


def ratios_from_scores(scores: torch.Tensor, grid: torch.Tensor, mapping: str = "rank") -> torch.Tensor:
    """Map per-head scores (..., H) to ratios (..., H).

    ``rank``: the highest score gets ``grid[0]`` (smallest). ``permutation``: head ``i`` gets
    ``grid[order[i]]`` with ``order`` the heads sorted by descending score (the reference code's
    ``cos[head_order]``). Ties keep head order (stable sort).
    """
    order = torch.argsort(-scores, dim=-1, stable=True)  # order[k] = head with k-th highest score
    if mapping == "permutation":
        return grid.to(scores.device)[order]
    rank = torch.argsort(order, dim=-1)  # rank[h] = position of head h in that order
    return grid.to(scores.device)[rank]


def position_awareness(q_last: torch.Tensor, k: torch.Tensor, mask_last: torch.Tensor | None, scaling: float,
                       threshold: float = 3.0) -> torch.Tensor:
    """Fraction of valid keys whose attention from the last query exceeds ``threshold`` x the row mean.

    q_last (B, H, 1, d) and k (B, H, kv, d) already rotated; mask_last additive (B|1, 1, 1, kv) or None.
    Returns (B, H).
    """
    logits = torch.matmul(q_last.float(), k.float().transpose(-1, -2)) * scaling
    if mask_last is not None:
        logits = logits + mask_last.float()
        valid = (mask_last > torch.finfo(mask_last.dtype).min / 2)[:, :, 0, :]  # (B|1, 1, kv)
    else:
        valid = torch.ones(logits.shape[0], 1, logits.shape[-1], dtype=torch.bool, device=logits.device)
    w = torch.softmax(logits, dim=-1)[:, :, 0, :]  # (B, H, kv)
    n = valid.sum(-1).clamp(min=1).float()  # (B|1, 1)
    mean = (w * valid).sum(-1) / n
    above = ((w > threshold * mean[..., None]) & valid).sum(-1).float()
    return above / n


class MsPoE:
    """The per-layer state and attention function of Ms-PoE."""

    def __init__(self, model, layers: list[int], grid: torch.Tensor | None, order: str,
                 fixed: torch.Tensor | None, threshold: float, mapping: str = "rank",
                 score_rope: str = "unrotated", rotated_cache: bool = True):
        self.layout = A.check_self_rotating(model, layers, "ms-poe")
        self.mapping, self.score_rope = mapping, score_rope
        self.layers = layers
        self.grid = grid
        self.order = order
        self.fixed = fixed
        self.threshold = threshold
        self.current: dict[int, torch.Tensor] = {}  # layer -> (B, H) ratios of the current prompt
        self.rotated = A.RotatedKeyCache() if rotated_cache else None  # ratios are fixed after the prefill

    def shared_by_groups(self, n_rep: int) -> bool:
        """Whether the query heads of each key head (groups of ``n_rep``) always get one ratio (an
        identity setting, or ratios repeated per group): then keys are rotated once per key head and
        the model's own grouped-query attention runs, exactly as unpatched. Decided from the static
        ratios on the CPU: the score order only permutes the grid, so a constant grid stays constant."""
        source = self.fixed if self.fixed is not None else self.grid
        if self.fixed is None and self.order != "index":
            return bool((source == source[0]).all())
        groups = source.reshape(-1, n_rep)
        return bool((groups == groups[:, :1]).all())

    def head_ratios(self, layer: int) -> torch.Tensor | None:
        """The (B, H) ratios used at the last call of ``layer`` (None before the first call)."""
        return self.current.get(layer)

    def attention(self, module, query, key, value, attention_mask, scaling=None, native=None, **kwargs):
        b, h, q_len, d = query.shape
        kv_len = key.shape[2]
        n_rep = h // key.shape[1]
        scaling = module.scaling if scaling is None else scaling
        rope = self.layout.layers[module.layer_idx]
        inv = self.layout.inv_freq(rope.layer_type).to(query.device)
        att_scale = rope.attention_scaling
        q_pos, k_pos = A.query_key_positions(query, key, kwargs.get("position_ids"))
        mask = A.float_mask(attention_mask, q_len, kv_len, query.dtype, query.device)
        layer = module.layer_idx

        ratios = self._ratios(layer, b, h, q_len, kv_len, query, key, n_rep, q_pos, k_pos, mask, inv, att_scale,
                              scaling)
        inv_h = inv[None, None, :] / ratios[..., None].to(inv.dtype)  # (B, H, d/2)
        cq, sq = A.cos_sin(q_pos[:, None, :], inv_h, att_scale, query.dtype)  # (B, H, q, d)
        grouped = n_rep > 1 and self.shared_by_groups(n_rep)
        inv_k = inv_h[:, ::n_rep] if grouped else inv_h  # (B, KV, d/2): one ratio per key head

        def rotate_keys(start: int) -> torch.Tensor:
            """Keys from ``start`` on, rotated: (B, KV, kv - start, d), or per query head (B, H, kv - start, d)."""
            ck, sk = A.cos_sin(k_pos[:, None, start:], inv_k, att_scale, query.dtype)
            return A.rotate(key[:, :, start:] if grouped else A.repeat_kv(key[:, :, start:], n_rep), ck, sk)

        k_rot = rotate_keys(0) if self.rotated is None else self.rotated.keys(module, "k", key, q_len, rotate_keys)
        out = A.attend_as_model(native, module, A.rotate(query, cq, sq), k_rot,
                                value if grouped else A.repeat_kv(value, n_rep),  # head h reads key head h // n_rep

                                attention_mask, scaling, per_query_head=not grouped, **kwargs)
        return out, None

    def _ratios(self, layer, b, h, q_len, kv_len, query, key, n_rep, q_pos, k_pos, mask, inv, att_scale, scaling):
        if self.fixed is not None:
            return self.fixed.to(query.device).expand(b, h)
        if self.order == "index":
            return self.grid.to(query.device).expand(b, h)
        prev = self.current.get(layer)
        is_prefill = kv_len == q_len
        if prev is not None and not is_prefill and prev.shape[0] == b:
            return prev
        # position-awareness from the last query token, on un-rotated q / k or under the model's RoPE
        q_last, keys = query[:, :, -1:], A.repeat_kv(key, n_rep)
        if self.score_rope == "rotated":
            c1, s1 = A.cos_sin(q_pos[:, None, -1:], inv[None, None], att_scale, query.dtype)
            ck, sk = A.cos_sin(k_pos[:, None, :], inv[None, None], att_scale, query.dtype)
            q_last, keys = A.rotate(q_last, c1, s1), A.rotate(keys, ck, sk)
        mask_last = None if mask is None else mask[:, :, -1:, :]
        scores = position_awareness(q_last, keys, mask_last, scaling, self.threshold)
        ratios = ratios_from_scores(scores, self.grid, self.mapping)
        self.current[layer] = ratios
        return ratios


def _ratio_range(r_min, r_max) -> tuple[float, float]:
    r_min, r_max = check_number("ms-poe: r_min", r_min, above=0), check_number("ms-poe: r_max", r_max, above=0)
    if r_max < r_min:
        raise ValueError(f"ms-poe: r_max ({r_max}) must be >= r_min ({r_min})")
    return r_min, r_max


def _fixed_ratios(ratios, n_heads: int) -> torch.Tensor:
    """Explicit per-query-head ratios, shape (H,); one value is repeated for every head."""
    ratios = as_list(ratios, float, "ms-poe: ratios")
    fixed = torch.tensor(ratios * n_heads if len(ratios) == 1 else ratios, dtype=torch.float32)
    if fixed.numel() != n_heads:
        raise ValueError(f"ms-poe: ratios needs one value per query head ({n_heads}), got {fixed.numel()}")
    if not bool((fixed > 0).all()):
        raise ValueError(f"ms-poe: every ratio must be > 0, got {fixed.tolist()}")
    return fixed


@register_method("ms-poe", "Ms-PoE: per-head position interpolation, ratios r_min..r_max ordered by "
                           "position-awareness (options r_min, r_max, skip_layers, layers, order, ratios)",
                 aliases=("mspoe", "ms_poe"))
def apply_ms_poe(model, r_min: float = 1.2, r_max: float = 1.8, skip_layers: int = 2,
                 layers: Sequence[int] | None = None, order: str = "score",
                 ratios: Sequence[float] | None = None, threshold: float = 3.0, mapping: str = "rank",
                 score_rope: str = "unrotated", rotated_cache: bool = True) -> MethodHandle:
    """Apply Ms-PoE.

    Args:
        r_min, r_max: ratio range (positions m -> m / r); both must be > 0.
        skip_layers: leave the first ``skip_layers`` layers unchanged (ignored when ``layers`` given).
        layers: explicit layer indices to patch.
        order: ``"score"`` (position-awareness, per prompt) or ``"index"``.
        ratios: explicit per-query-head ratios (length H), overriding r_min/r_max/order.
        threshold: the "x row mean" threshold of the position-awareness score.
        mapping: ``rank`` or ``permutation`` (scores -> ratios; see the module docstring).
        score_rope: ``unrotated`` or ``rotated`` q / k for the score (see the module docstring).
        rotated_cache: keep the rotated keys between decoding steps (the ratios are fixed after the
            prefill), so a step rotates only its new keys; ``False`` re-rotates the whole cache each
            step (same outputs, the cost of the earlier implementation).
    """
    n_layers = len(get_decoder_layers(model))
    n_heads = int(model.config.num_attention_heads)
    r_min, r_max = _ratio_range(r_min, r_max)
    order = as_choice(order, ("score", "index"), "ms-poe: order")
    mapping = as_choice(mapping, MAPPINGS, "ms-poe: mapping")
    score_rope = as_choice(score_rope, SCORE_ROPE, "ms-poe: score_rope")
    fixed = None if ratios is None else _fixed_ratios(ratios, n_heads)
    if layers is None:
        layers = list(range(min(check_int("ms-poe: skip_layers", skip_layers, minimum=0), n_layers), n_layers))
    else:
        layers = as_layer_indices(layers, n_layers, "ms-poe: layers")
    grid = ratio_grid(n_heads, r_min, r_max)
    rotated_cache = as_bool(rotated_cache, "ms-poe: rotated_cache")
    threshold = check_number("ms-poe: threshold", threshold, at_least=0)
    state = MsPoE(model, layers, grid, order, fixed, threshold, mapping, score_rope, rotated_cache)
    patch = A.RopeAttentionPatch(model, layers, state.attention)
    per_prompt = fixed is None and order == "score"
    if per_prompt:  # scorers prefill each prompt alone (no answer in the head order; no shared contexts)
        mark_prompt_dependent(model)

    def remove():
        patch.remove()
        mark_prompt_dependent(model, False)

    opts = {"r_min": r_min, "r_max": r_max, "layers": layers, "order": order,
            "ratios": None if fixed is None else fixed.tolist(), "threshold": float(threshold),
            "mapping": mapping, "score_rope": score_rope, "rotated_cache": rotated_cache}
    return MethodHandle("ms-poe", model, remove_fn=remove, options=opts, state={"ms_poe": state},
                        shared_prefill=not per_prompt)
