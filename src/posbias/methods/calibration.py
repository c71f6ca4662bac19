"""Found-in-the-middle attention calibration (Hsieh et al., "Found in the Middle: Calibrating Positional
Attention Bias Improves Long Context Utilization", ACL Findings 2024, arXiv 2406.16008; no public code).

A model's attention to a record mixes two things: how relevant the record is and where it sits (the U of
positional bias). The calibration takes the second out and gives the answer the first:

1. **Document attention** ``Attn(x, k)``: the attention that the position predicting the next token pays to
   record ``k``, per token of the record (the mean over its tokens), averaged over every layer and head.
2. **Positional bias** ``Attn(x_dum, k)``: the same quantity for a record that is not the answer, at slot
   ``k``, averaged over many prompts (``posbias attention-bias`` writes it from the search split: the
   non-gold records of real prompts, per slot; the paper's cheaper variant of its dummy documents).
3. **Calibrated relevance** ``rel_k = Attn(x, k) - Attn(x_dum, k)`` and ``alpha = softmax(rel / t)``.
4. **Intervention**, in the last half of the layers (earlier layers make generation unstable, the paper),
   every head, the answer rows only (the prompt's last token, the answer's tokens, each decoded token): the
   attention weights of record ``k``'s tokens are rescaled so that the records' per-token means follow
   ``alpha`` while the mass on the records stays what it was (``a'_i = a_i * alpha_k / Attn_orig(D_k) * C``):
   record ``k`` gets ``M * alpha_k N_k / sum_j alpha_j N_j`` of the records' mass ``M`` (``N_k`` its tokens).
   With ``alpha_k`` proportional to the original per-token means nothing changes.

Step 1 needs every layer's attention before step 4 acts in the later layers, so each forward that holds
answer rows runs twice: once to read the attention (on a copy of the cache), once with the intervention. The
records' spans come from the scorers (:mod:`posbias.methods.forward_rows`); a forward without them (a shared
context's prefill) runs unchanged. Prompt rows are never touched.

Options: ``bias`` (the ``attention_bias.json`` of ``posbias attention-bias``: one value per record slot, for
prompts with that many records), ``t`` (the temperature; 5e-5 in the paper, "robust across settings"; tune it
on the search split), ``layers`` (``last-half`` or layer indices), ``mode`` (``calibrated``; ``original``
leaves every weight as it is: the plumbing without the change, bit-identical to the model).
"""
from __future__ import annotations

import math
import weakref
from pathlib import Path

import torch

from posbias.architecture.layers import get_decoder_layers, repeat_cache
from posbias.methods.attention_rows import AttentionOverride, weights_at
from posbias.methods.forward_rows import ForwardRows, rows_of
from posbias.methods.registry import MethodHandle, as_choice, as_layer_indices, register_method
from posbias.methods.rope_attention import repeat_kv
from posbias.utils.io import read_json

NAME = "posbias_attention_calibration"
BIAS_FORMAT = "posbias-attention-bias"
MODES = ("calibrated", "original")
CACHE_KWARGS = ("cache", "past_key_values")

_MODULES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # attention module -> its Calibration


def load_bias(path: str | Path) -> dict:
    """An attention-bias file (``posbias attention-bias``), checked: one finite value per record slot."""
    doc = read_json(Path(path).expanduser())
    bias = doc.get("bias") if isinstance(doc, dict) else None
    if not isinstance(doc, dict) or doc.get("format") != BIAS_FORMAT or not isinstance(bias, list) or not bias:
        raise ValueError(f"{path}: not an attention-bias file (posbias attention-bias writes one)")
    if not all(isinstance(v, (int, float)) and math.isfinite(v) for v in bias):
        raise ValueError(f"{path}: every bias value must be a finite number")
    return doc


def record_owner(rows: ForwardRows, kv: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """Per batch row, the record each of a layer's ``kv`` keys belongs to (``(B, kv)``, -1: none) and the
    records' token counts (``(B, K)``; K = the most records of any row). A sliding-window layer's keys are
    the last ``kv`` of the forward's ``rows.total``."""
    shift = rows.total - kv
    k_max = max((len(r.spans) for r in rows.rows if r.spans), default=0)
    owner = torch.full((len(rows.rows), kv), -1, dtype=torch.long)
    counts = torch.zeros((len(rows.rows), max(k_max, 1)))
    for b, r in enumerate(rows.rows):
        for k, (s, e) in enumerate(r.spans or ()):
            lo, hi = r.key_start + s - shift, r.key_start + e - shift
            counts[b, k] = e - s
            owner[b, max(lo, 0):max(hi, 0)] = k
    return owner.to(device), counts.to(device)


def answer_rows(rows: ForwardRows, q_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The answer rows of a forward: per batch row the queries from its prompt's last token on (all of them
    when that token came in an earlier forward); ``(index (B, R), valid (B, R))``, padded with the last."""
    starts = [max(r.query_row, 0) if r.id is not None and r.spans else q_len for r in rows.rows]
    width = max(1, max(q_len - s for s in starts))
    index = torch.tensor([[min(s + j, q_len - 1) for j in range(width)] for s in starts])
    valid = torch.tensor([[s + j < q_len for j in range(width)] for s in starts])
    return index, valid


def per_token_means(weights: torch.Tensor, owner: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """Each record's attention per token: ``weights`` (B, ..., kv) summed over the record's keys and divided
    by its token count -> (B, ..., K)."""
    mass = record_mass(weights, owner, counts.shape[-1])
    shape = (counts.shape[0],) + (1,) * (mass.dim() - 2) + (counts.shape[-1],)
    return mass / counts.clamp(min=1).view(shape)


def record_mass(weights: torch.Tensor, owner: torch.Tensor, k: int) -> torch.Tensor:
    """``weights`` (B, ..., kv) summed per record (owner (B, kv), -1: none) -> (B, ..., K)."""
    middle = weights.shape[1:-1]
    index = owner.clamp(min=0).view(owner.shape[0], *([1] * len(middle)), owner.shape[1]).expand(weights.shape)
    kept = weights * (owner >= 0).view(owner.shape[0], *([1] * len(middle)), owner.shape[1])
    out = torch.zeros(*weights.shape[:-1], k + 1, dtype=weights.dtype, device=weights.device)
    return out.scatter_add_(-1, index, kept)[..., :k]


def reweight(weights: torch.Tensor, owner: torch.Tensor, counts: torch.Tensor, alpha: torch.Tensor) -> torch.Tensor:
    """The intervention: ``weights`` (B, H, R, kv) with the records' tokens rescaled so that record ``k`` gets
    ``M alpha_k N_k / sum_j alpha_j N_j`` of the records' mass ``M`` (alpha (B, R, K), N = counts (B, K));
    other keys unchanged."""
    w = weights.float()
    mass = record_mass(w, owner, counts.shape[-1])  # (B, H, R, K)
    total = mass.sum(-1, keepdim=True)
    share = alpha[:, None] * counts[:, None, None, :]
    target = total * share / share.sum(-1, keepdim=True).clamp(min=1e-30)
    scale = torch.where(mass > 0, target / mass.clamp(min=1e-30), torch.ones_like(mass))
    index = owner.clamp(min=0)[:, None, None, :].expand(w.shape)
    per_key = torch.gather(scale, -1, index).masked_fill((owner < 0)[:, None, None, :], 1.0)
    return (w * per_key).to(weights.dtype)


class Calibration:
    """Attention calibration applied to a model (module docstring); ``model`` is what scorers call."""

    def __init__(self, model, bias: list[float], t: float, layers: list[int], mode: str):
        self.base, self.bias, self.t, self.layers, self.mode = model, [float(v) for v in bias], t, set(layers), mode
        self.model = CalibratedModel(self)
        self.phase: str | None = None  # "read" (pass 1) or "apply" (pass 2) while a described forward runs
        self.rows: ForwardRows | None = None
        self.read: dict[int, torch.Tensor] = {}  # layer -> head-mean weights of the answer rows (B, R, kv)
        self.alpha: torch.Tensor | None = None
        self._override = AttentionOverride(model, NAME, _dispatch, _MODULES, self,
                                           "calibration re-weights the model's own attention; another method "
                                           "computes attention itself here")

    def remove(self) -> None:
        self._override.remove()

    def forward(self, **kwargs):
        """The model's forward; a forward described with answer rows over records runs twice (read, apply)."""
        rows = rows_of(self.model)
        if rows is None or self.mode == "original" or not any(r.id is not None and r.spans for r in rows.rows):
            return self.base(**kwargs)
        read = dict(kwargs, logits_to_keep=1)
        for name in CACHE_KWARGS:
            if read.get(name) is not None:
                read[name] = repeat_cache(read[name], 1)  # pass 1 must not grow the real cache
        self.rows, self.read = rows, {}
        try:
            self.phase = "read"
            self.base(**read)
            self.alpha = self.calibrated_alpha()
            self.phase = "apply"
            return self.base(**kwargs)
        finally:
            self.phase, self.rows, self.read, self.alpha = None, None, {}, None

    def calibrated_alpha(self) -> torch.Tensor:
        """``softmax((Attn(x, k) - bias_k) / t)`` per batch row and answer row, over the records (B, R, K)."""
        weights = torch.stack([self.read[k] for k in sorted(self.read)]).mean(0)  # (B, R, kv): all layers
        owner, counts = record_owner(self.rows, weights.shape[-1], weights.device)
        attn = per_token_means(weights, owner, counts)  # (B, R, K)
        k = attn.shape[-1]
        bias = torch.tensor((self.bias + [self.bias[-1]] * k)[:k], device=attn.device)
        rel = (attn - bias) / self.t
        return torch.softmax(rel.masked_fill((counts == 0)[:, None, :], float("-inf")), dim=-1)

    def attend(self, module, query, key, value, attention_mask, kwargs, out):
        """Pass 1: keep this layer's head-mean answer-row weights; pass 2 (calibrated layers): replace the answer
        rows' outputs with re-weighted attention. ``out`` (B, q, H, d) is the model's own result."""
        index, valid = answer_rows(self.rows, query.shape[2])
        weights = weights_at(module, query, key, value, attention_mask, index, kwargs)  # (B, H, R, kv)
        if self.phase == "read":  # on the forward's full key range (a sliding-window layer sees its last keys)
            full = torch.zeros(*weights.shape[:1], weights.shape[2], self.rows.total, device=weights.device)
            full[..., self.rows.total - key.shape[2]:] = weights.float().mean(1)
            self.read[int(module.layer_idx)] = full
            return out
        if int(module.layer_idx) not in self.layers:
            return out
        owner, counts = record_owner(self.rows, key.shape[2], query.device)
        new = reweight(weights, owner, counts, self.alpha.to(query.device))
        groups = query.shape[1] // value.shape[1]
        rows_out = torch.matmul(new.to(value.dtype), repeat_kv(value, groups)).transpose(1, 2)  # (B, R, H, d)
        out = out.clone()
        for b in range(out.shape[0]):
            keep = valid[b]
            out[b, index[b][keep]] = rows_out[b, keep].to(out.dtype)
        return out


class CalibratedModel:
    """What scorers call under calibration: the base model, run twice when a forward holds answer rows."""

    def __init__(self, calibration: Calibration):
        self._calibration = calibration

    def __call__(self, *args, **kwargs):
        if args:
            kwargs = dict(kwargs, input_ids=args[0])
        return self._calibration.forward(**kwargs)

    def forward(self, *args, **kwargs):
        return self(*args, **kwargs)

    def __getattr__(self, name):
        if name == "_calibration":
            raise AttributeError(name)
        return getattr(self._calibration.base, name)


def _dispatch(module, query, key, value, attention_mask, **kwargs):
    cal = _MODULES.get(module)
    out, weights = cal._override.native(module)(module, query, key, value, attention_mask, **kwargs)
    if cal.phase is None:
        return out, weights
    return cal.attend(module, query, key, value, attention_mask, kwargs, out), None


@register_method("calibration", "found-in-the-middle attention calibration: the positional attention bias "
                                "subtracted, the answer rows' attention re-weighted by calibrated relevance in the "
                                "last half of the layers (options bias=PATH, t, layers, mode)",
                 aliases=("attention-calibration", "found-in-the-middle"))
def apply_calibration(model, bias: str | None = None, t: float = 5e-5, layers="last-half",
                      mode: str = "calibrated") -> MethodHandle:
    if bias is None:
        raise ValueError("calibration needs the positional bias of its prompts: bias=PATH (posbias attention-bias "
                         "writes it from the search split)")
    doc = load_bias(bias)
    try:
        t = float(t)
    except (TypeError, ValueError):
        raise ValueError(f"calibration: t must be a number, got {t!r}") from None
    if not (math.isfinite(t) and t > 0):
        raise ValueError(f"calibration: t must be a finite number > 0, got {t}")
    as_choice(mode, MODES, "calibration mode")
    n = len(get_decoder_layers(model))
    chosen = list(range((n + 1) // 2, n)) if layers == "last-half" else as_layer_indices(layers, n, "layers")
    cal = Calibration(model, doc["bias"], t, chosen, mode)
    return MethodHandle("calibration", model, model=cal.model, remove_fn=cal.remove,
                        options={"bias": str(bias), "t": t, "layers": layers, "mode": mode},
                        state={"calibration": cal, "layers": chosen})


__all__ = ["BIAS_FORMAT", "Calibration", "apply_calibration", "load_bias", "reweight"]
