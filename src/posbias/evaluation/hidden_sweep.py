"""Many positional-hidden settings scored from one plain prefill per prompt.

Positional hidden-state scaling (:mod:`posbias.methods.positional_hidden`, Yu et al. 2024, arXiv
2406.02536) leaves every row of a prompt the model's own except the last ``R``
(``last_recompute_tokens``); those rows and every answer token attend with scaled queries to the
*scaled keys* of the patched layers. So one plain prefill of ``prompt[:-R]`` serves every setting:

1. the prompt minus its last ``R`` tokens is prefilled once by the unpatched model, keeping each
   candidate layer's attention input (1, P - R, D) and call arguments (position embeddings, ids);
2. per setting, a copy of that cache gets the patched layers' keys (and values with
   ``change_value``) recomputed from those inputs with the dimensions scaled: the attention module
   itself projects, normalises and rotates them, and the call stops at its cache update, before any
   attention is computed;
3. the last ``R`` prompt tokens and the answer are fed through that cache with the method applied:
   its cached-step path recomputes every fed row, which is what the reference computes for them.

The plain cache also gives the unpatched model's score. The result equals scoring each setting on
its own (float tolerance; tested), at the cost of one prefill per prompt plus, per setting, the q / k
/ v projections of its layers: a grid of 18 settings costs about one evaluation instead of 18.
"""
from __future__ import annotations

from collections import defaultdict
from typing import Callable, Sequence

import torch

from posbias.architecture.layers import get_decoder_layers, repeat_cache
from posbias.evaluation.batching import encode, model_max_positions, pad_id_of
from posbias.evaluation.scoring import Continuation, prefill, score_continuations
from posbias.methods.positional_hidden import CACHE_KWARGS, HiddenScaleConfig, build_config, scale_hidden
from posbias.methods.registry import apply_method

METHOD = "positional-hidden"


class _Projected(Exception):
    """Raised by :class:`_ProjectionOnly` to end an attention call once its keys / values exist."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor):
        super().__init__("projection done")
        self.keys, self.values = keys, values


class _ProjectionOnly:
    """Stands in for the KV cache of one attention call: its ``update`` receives the rotated keys and
    the values (B, KV, q, d) and stops the call before the attention itself."""

    def update(self, key_states, value_states, *args, **kwargs):
        raise _Projected(key_states, value_states)

    def get_seq_length(self, *args, **kwargs) -> int:
        return 0


def projected_keys(attn: torch.nn.Module, hidden: torch.Tensor, kwargs: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """The keys (rotated, normalised where the model does) and values (B, KV, q, d) that ``attn`` would
    cache for ``hidden`` (B, q, D) under the call arguments ``kwargs`` of an earlier call."""
    kw = {k: v for k, v in kwargs.items() if k not in ("hidden_states", *CACHE_KWARGS)}
    try:
        attn(hidden_states=hidden, cache=_ProjectionOnly(), **kw)
    except _Projected as done:
        return done.keys, done.values
    raise ValueError(f"positional-hidden: {type(attn).__name__} computed its attention without updating a "
                     "cache; its keys cannot be recomputed")


class _InputRecorder:
    """Forward pre-hooks keeping each listed layer's attention input and call arguments."""

    def __init__(self, model, layers: Sequence[int]):
        self.inputs: dict[int, tuple[torch.Tensor, dict]] = {}
        decoder = get_decoder_layers(model)
        self._hooks = [decoder[i].self_attn.register_forward_pre_hook(self._hook(i), with_kwargs=True)
                       for i in layers]

    def _hook(self, layer: int):
        def hook(module, args, kwargs):
            hidden = kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]
            self.inputs[layer] = (hidden, {k: v for k, v in kwargs.items() if k != "hidden_states"})
        return hook

    def remove(self) -> None:
        for h in self._hooks:
            h.remove()


def scaled_cache(model, cache, inputs: dict, cfg: HiddenScaleConfig):
    """A copy of the plain ``cache`` whose layers in ``cfg.layers`` hold the keys (and, with
    ``change_value``, the values) of the scaled inputs ``inputs[layer] = (hidden, call kwargs)``."""
    out = repeat_cache(cache, 1)
    decoder = get_decoder_layers(model)
    for i in cfg.layers:
        hidden, kwargs = inputs[i]
        with torch.no_grad():
            keys, values = projected_keys(decoder[i].self_attn, scale_hidden(hidden, cfg, kwargs.get("position_ids")),
                                          kwargs)
        layer = out.layers[i]
        kept = layer.keys.shape[-2]  # a sliding-window layer keeps only its last tokens
        layer.keys = keys[..., -kept:, :].to(layer.keys.dtype)
        if cfg.change_value:
            layer.values = values[..., -kept:, :].to(layer.values.dtype)
    return out


def score_hidden_settings(model, tokenizer, instances, settings: Sequence[dict],
                          on_instance: Callable[[int], None] | None = None) -> tuple[list[dict], list[list[dict]]]:
    """Teacher-forced scores of ``instances`` under the unpatched model and under each positional-hidden
    ``settings[s]`` (method options); returns ``(plain rows, rows per setting)`` in instance order,
    records as :func:`posbias.evaluation.teacher_forced.score_instances` writes them. Instances are
    scored one prompt at a time (shared contexts are not used); ``on_instance(k)`` is called after
    the ``k``-th."""
    configs = [build_config(model, **s) for s in settings]
    by_r: dict[int, list[int]] = defaultdict(list)
    for k, cfg in enumerate(configs):
        by_r[cfg.last_recompute_tokens].append(k)
    plain, rows = [], [[] for _ in settings]
    limit, pad_id = model_max_positions(model), pad_id_of(tokenizer)
    groups = sorted(by_r.items()) or [(1, [])]
    for done, inst in enumerate(instances, 1):
        e = encode(tokenizer, inst, False, limit)
        for g, (r, members) in enumerate(groups):
            scored = _score_prompt(model, e, [(settings[k], configs[k]) for k in members], r, pad_id)
            if g == 0:
                plain.append(scored[0])
            for k, row in zip(members, scored[1:]):
                rows[k].append(row)
        if on_instance is not None:
            on_instance(done)
    return plain, rows


def _score_prompt(model, e, settings: list[tuple[dict, HiddenScaleConfig]], r: int, pad_id: int) -> list[dict]:
    """``[plain row, row of each setting]`` for one encoded instance ``e``, all sharing ``R = r``."""
    prompt = e.prompt_ids
    if len(prompt) <= r:
        raise ValueError(f"instance {e.inst.id}: a {len(prompt)}-token prompt has no row before the last "
                         f"{r} (last_recompute_tokens)")
    layers = sorted({i for _, cfg in settings if not cfg.identity for i in cfg.layers})
    recorder = _InputRecorder(model, layers)
    try:
        last, cache, mask, next_pos = prefill(model, [prompt[:-r]], pad_id)
    finally:
        recorder.remove()
    item = [Continuation(e.inst.id, prompt[-r:] + e.answer_ids, len(e.answer_ids), len(prompt))]
    plain = score_continuations(model, repeat_cache(cache, 1), mask, next_pos, last, item, pad_id)[0]
    out = [plain]
    for options, cfg in settings:
        if cfg.identity:
            out.append(dict(plain))
            continue
        scaled = scaled_cache(model, cache, recorder.inputs, cfg)
        with apply_method(model, METHOD, **options) as handle:
            out.append(score_continuations(handle.model, scaled, mask, next_pos, last, item, pad_id)[0])
    return out
