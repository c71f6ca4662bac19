"""Where attention went: each layer's attention from the last prompt position over the task's records.

Accuracy by depth says *that* a model loses the middle; this says *how*. For every scored question, at
the last prompt position (the one whose logits predict the answer's first token), each layer's
attention weights over the prompt (heads x prompt tokens) are taken while the scoring forward runs, and
reduced to the task's records (``meta["item_spans"]``: KV records, MDQA documents):

* ``gold_mass[l]``: attention on the gold record's tokens, averaged over heads (a share of the whole
  row, attention sinks included);
* ``gold_rank[l]``: the gold record's rank among the records by that head-averaged mass (1 = the
  most attended record); with several gold items (HotpotQA's two paragraphs) the best of them;
* ``hit[l]``: the share of heads whose largest attention over record tokens lands inside a gold record
  (the retrieval-head criterion of Wu et al., ICLR 2025, applied to the prompt's last position).

A gold record that is never among the most attended is "never looked at"; one that is attended while
the answer is wrong was "looked at and copied wrong" (the failure classes of ``posbias map --mode both``
tell the two apart by the answer; this tells them apart by the attention). Hsieh et al. (ACL Findings
2024, "Found in the middle") rank documents by the same head- and layer-averaged attention.

How it is computed: :class:`AttentionProbe` gives every attention module a private config naming
:data:`PROBE_NAME`, a function that returns the model's own attention (its kernel, SDPA or eager, so
scores are unchanged) and, for the one query row a scorer asked for per batch row
(:mod:`posbias.methods.forward_rows`), evaluates the modeling file's eager attention on that row alone:
``(B, H, 1, kv)`` weights, never an ``L x L`` matrix. Methods that compute attention themselves
(Ms-PoE, MoICE, Attention Buckets' parallel passes) are refused with one line.
"""
from __future__ import annotations

import weakref
from typing import Sequence

import torch

from posbias.architecture.layers import get_decoder_layers
from posbias.methods.attention_rows import AttentionOverride, weights_at
from posbias.methods.forward_rows import ForwardRows, rows_of

PROBE_NAME = "posbias_attention_probe"
NOT_PROBED = "the attention diagnostic needs a model whose attention modules call their model's own attention "

_PROBES: weakref.WeakKeyDictionary[torch.nn.Module, "AttentionProbe"] = weakref.WeakKeyDictionary()
_MODULE_PROBE: weakref.WeakKeyDictionary[torch.nn.Module, "AttentionProbe"] = weakref.WeakKeyDictionary()


class AttentionProbe:
    """Capture each layer's attention from one query row per batch row (module docstring).

    Use as a context manager around scoring; ``remove()`` restores every module's config. Results:
    :meth:`pop` ``(id) -> (L, H, P)`` float32 on the CPU (P: the row's prompt tokens)."""

    def __init__(self, model, record_means: bool = False):
        self.model = model
        self.record_means = record_means  # also every record's per-token attention (attention-bias estimates)
        self._rows: dict[str, dict[int, torch.Tensor]] = {}
        try:
            get_decoder_layers(model)
        except Exception as e:  # noqa: BLE001 (a wrapper model: Attention Buckets)
            raise ValueError(f"{NOT_PROBED}({e})") from None
        self._override = AttentionOverride(model, PROBE_NAME, _dispatch, _MODULE_PROBE, self,
                                           f"{NOT_PROBED}(a method that computes attention itself, such as ms-poe, "
                                           "moice or calibration, or the diagnostic already active)")
        _PROBES[model] = self

    def __enter__(self) -> "AttentionProbe":
        return self

    def __exit__(self, *exc) -> None:
        self.remove()

    def remove(self) -> None:
        self._override.remove()
        if _PROBES.get(self.model) is self:
            del _PROBES[self.model]

    def pop(self, id_: str) -> torch.Tensor | None:
        """The captured attention of row ``id_`` as ``(L, H, P)`` float32 (None if it was not captured)."""
        layers = self._rows.pop(id_, None)
        return None if not layers else torch.stack([layers[k] for k in sorted(layers)])

    def clear(self) -> None:
        self._rows.clear()

    def capture(self, module, query, key, value, attention_mask, kwargs, fr: ForwardRows) -> None:
        """Record, for each described row, its prompt's last token's attention over its prompt (called by
        :func:`_dispatch`)."""
        batch, kv = query.shape[0], key.shape[2]
        if batch != len(fr.rows):
            raise ValueError(f"{NOT_PROBED}(batch of {batch} rows where {len(fr.rows)} were expected: a method "
                             "that runs the model in parallel passes, such as attention-buckets)")
        rows = torch.tensor([[max(r.query_row, 0)] for r in fr.rows])
        weights = weights_at(module, query, key, value, attention_mask, rows, kwargs)[:, :, 0].float()  # (B, H, kv)
        shift = fr.total - kv  # a sliding-window cache keeps only the last kv keys
        for b, r in enumerate(fr.rows):
            if r.id is None or r.query_row < 0:  # a row whose last prompt token is not in this forward
                continue
            start, length = r.key_start, r.key_length
            row = torch.zeros(weights.shape[1], length, dtype=torch.float32)
            lo = max(start, shift)
            if lo < start + length:
                row[:, lo - start:] = weights[b, :, lo - shift: start + length - shift].cpu()
            self._rows.setdefault(r.id, {})[int(module.layer_idx)] = row


def _dispatch(module, query, key, value, attention_mask, **kwargs):
    probe = _MODULE_PROBE.get(module)
    out = probe._override.native(module)(module, query, key, value, attention_mask, **kwargs)
    fr = rows_of(probe.model)
    if fr is not None:
        probe.capture(module, query, key, value, attention_mask, kwargs, fr)
    return out


def probe_of(model) -> AttentionProbe | None:
    """The attention probe active on ``model`` (None: scoring without the diagnostic)."""
    return _PROBES.get(model)


def record_means(att: torch.Tensor, spans: Sequence[tuple[int, int]]) -> list[float]:
    """Every record's attention per token (the mean over its tokens), averaged over layers and heads: the
    document attention of Hsieh et al. 2024, from ``att`` (L, H, P)."""
    row = att.mean((0, 1))  # (P,)
    return [round(float(row[s:e].mean()), 9) for s, e in spans]


def gold_attention(att: torch.Tensor, spans: Sequence[tuple[int, int]], gold: Sequence[int]) -> dict:
    """The diagnostic of one question from its captured attention ``att`` (L, H, P) over the prompt, the
    records' token spans ``[(start, end), ...]`` and the gold record indices (module docstring):
    ``attn_gold_mass`` / ``attn_gold_rank`` (from the layer-averaged masses), ``attn_hit_rate`` (over all
    heads of all layers) and per layer ``attn_layers`` = ``{gold_mass, gold_rank, hit}``."""
    layers, heads, length = att.shape
    starts = torch.tensor([s for s, _ in spans])
    ends = torch.tensor([e for _, e in spans])
    cum = torch.nn.functional.pad(att.cumsum(-1), (1, 0))  # (L, H, P + 1)
    mass = cum[..., ends] - cum[..., starts]  # (L, H, R)
    per_layer = mass.mean(1)  # (L, R)
    gold = list(gold)
    others = torch.ones(mass.shape[-1], dtype=torch.bool)
    others[gold] = False

    def rank(m: torch.Tensor) -> torch.Tensor:  # (..., R) -> rank of the best gold record
        best = m[..., gold].max(-1).values
        return 1 + (m[..., others] > best[..., None]).sum(-1)

    owner = torch.full((length,), -1, dtype=torch.long)  # the record each token belongs to (-1: none)
    for r, (s, e) in enumerate(spans):
        owner[s:e] = r
    in_records = owner >= 0
    top = att.masked_fill(~in_records, -1.0).argmax(-1)  # (L, H): the most attended record token
    hit = torch.isin(owner[top], torch.tensor(gold)).float()  # (L, H)
    return {"attn_gold_mass": round(float(per_layer[:, gold].sum(-1).mean()), 6),
            "attn_gold_rank": int(rank(per_layer.mean(0))),
            "attn_hit_rate": round(float(hit.mean()), 6),
            "attn_layers": {"gold_mass": [round(float(v), 6) for v in per_layer[:, gold].sum(-1)],
                            "gold_rank": [int(v) for v in rank(per_layer)],
                            "hit": [round(float(v), 6) for v in hit.mean(-1)]}}
