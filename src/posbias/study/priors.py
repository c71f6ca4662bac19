"""Views of what a trained model learned about position: GGD priors, any prior's curves and attention maps.

GGD readout. A GGD-BAM layer adds, per head h, the bias (reference parametrisation)::

    b_h(d) = -exp(theta_alpha_h) * (|d| + eps) ** theta_beta_h

Writing it as the log density of a generalized Gaussian, ``b(d) = -|d / alpha|^beta``, gives::

    beta  = theta_beta
    alpha = exp(-theta_alpha / theta_beta)        (theta_beta != 0; the prior's scale, in tokens)

so ``alpha`` is the distance at which the bias reaches -1. With ``theta_beta == 0`` the bias is
the constant ``-exp(theta_alpha)`` (a uniform prior, i.e. NoPE) and ``alpha`` is undefined
(reported as ``inf``). ``beta <= 0`` means the head does *not* favour nearby tokens (flat, or
penalising local context: the bias grows towards 0 with distance); those heads are marked in
:func:`plot_priors`.

Attention maps. :func:`attention_maps` runs one forward pass with ``output_attentions=True`` and
collects per-layer attention probabilities: BAM models return those of
:func:`posbias.attention.attend` (``return_probs``: scaled q k^T + prior, x SSMax factor, masks,
float32 softmax); Hugging Face models need eager attention.
"""
from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Iterable, Mapping, Sequence

import torch

from posbias.study.plots import plt, save_figure

# ----------------------------------------------------------------------------- GGD priors

def ggd_alpha_beta(theta_alpha: float, theta_beta: float) -> tuple[float, float]:
    """``(alpha, beta)`` of ``-exp(ta) * d^tb = -|d / alpha|^beta``: ``beta = tb``,
    ``alpha = exp(-ta / tb)`` (``inf`` when ``tb == 0``)."""
    ta, tb = float(theta_alpha), float(theta_beta)
    if tb == 0.0:
        return math.inf, 0.0
    x = -ta / tb
    return (math.exp(x) if x < 700 else math.inf), tb


def ggd_bias(theta_alpha, theta_beta, distances, eps: float = 1e-5) -> torch.Tensor:
    """Bias ``-exp(ta) * (d + eps)^tb`` for heads ``[H]`` x distances ``[D]`` -> float64 ``[H, D]``."""
    ta = torch.as_tensor(theta_alpha, dtype=torch.float64).reshape(-1, 1)
    tb = torch.as_tensor(theta_beta, dtype=torch.float64).reshape(-1, 1)
    d = torch.as_tensor(distances, dtype=torch.float64).reshape(1, -1).abs()
    return -torch.exp(ta + tb * torch.log(d + eps))


def _layer_index(name: str) -> int | None:
    m = re.search(r"(?:layers?|priors)\.(\d+)", name)
    return int(m.group(1)) if m else None


def ggd_priors(model) -> list[dict]:
    """Every GGD head of ``model``: ``{module, layer, head, theta_alpha, theta_beta, alpha, beta, eps}``.

    A GGD module is any module with ``theta_alpha`` and ``theta_beta`` tensors of one value per
    head (``posbias.positional.ggd.GGDBias``). Layer indices come from the module name
    (``model.priors.<i>`` in BAM, or ``...layers.<i>...``); a single prior in a model of several
    layers (``ggd_share_layers``) is shared and gets ``layer = None``.
    """
    mods = [(name, mod) for name, mod in model.named_modules()
            if isinstance(getattr(mod, "theta_alpha", None), torch.Tensor)
            and isinstance(getattr(mod, "theta_beta", None), torch.Tensor)]
    n_layers = int(getattr(getattr(model, "config", None), "num_hidden_layers", 0) or 0)
    shared = len(mods) == 1 and n_layers > 1
    out = []
    for name, mod in mods:
        ta, tb = mod.theta_alpha, mod.theta_beta
        ta = ta.detach().float().flatten().cpu()
        tb = tb.detach().float().flatten().cpu()
        eps = float(getattr(mod, "eps", 1e-5))
        for h, (a, b) in enumerate(zip(ta.tolist(), tb.tolist())):
            alpha, beta = ggd_alpha_beta(a, b)
            out.append({"module": name, "layer": None if shared else _layer_index(name), "head": h, "theta_alpha": a,
                        "theta_beta": b, "alpha": alpha, "beta": beta, "eps": eps})
    return out


def prior_curves(model, distances: Sequence[int], query_position: int | None = None) -> list[dict]:
    """The learned bias of every positional prior of a BAM ``model`` (GGD, ALiBi, KERPLE, FIRE), per layer
    and head, at ``distances`` tokens back from one query: ``{layer, head, distances, bias, params}``
    (``params``: the head's own scalars, e.g. KERPLE's ``r1`` / ``r2`` as stored). A distance-only prior
    is the same for every query; FIRE also depends on the query's position, ``query_position`` (default
    the largest distance: the key at position 0). ``layer`` is None for a prior shared by all layers;
    [] for a model without a prior."""
    bam = getattr(model, "model", model)
    priors = getattr(bam, "priors", None)
    if priors is None:
        return []
    d = torch.as_tensor(list(distances), dtype=torch.long)
    i = int(d.max()) if query_position is None else int(query_position)
    if int(d.min()) < 0 or int(d.max()) > i:
        raise ValueError(f"distances must lie in [0, {i}] (the query position), got {d.min().item()}..{d.max().item()}")
    n_layers = int(getattr(getattr(model, "config", None), "num_hidden_layers", 0) or 0)
    shared = len(priors) == 1 and n_layers > 1
    out = []
    for layer, prior in enumerate(priors):
        device = next(iter(prior.parameters()), torch.zeros(0)).device
        with torch.no_grad():
            bias = prior(torch.tensor([i], device=device), (i - d).to(device))[:, 0].float().cpu()  # [H, D]
        per_head = {n: p.detach().float().cpu() for n, p in prior.named_parameters()
                    if p.dim() == 1 and p.numel() == bias.shape[0]}
        for h in range(bias.shape[0]):
            out.append({"layer": None if shared else layer, "head": h, "query_position": i,
                        "distances": d.tolist(), "bias": bias[h].tolist(),
                        "params": {n: v[h].item() for n, v in per_head.items()}})
    return out


def plot_priors(priors: Sequence[Mapping], path: str | Path, *, max_distance: int = 32768,
                title: str = "learned GGD priors") -> Path:
    """One panel per layer: each head's bias against distance (log x), with its (alpha, beta).

    Heads with ``beta <= 0`` (no preference for nearby tokens) are drawn dashed and marked ``*``.
    The y axis is the bias itself (symlog), clipped to [-100, 0] (-100 already means "never
    attended").
    """
    if not priors:
        raise ValueError("no GGD priors to plot (the model has no GGD layers)")
    layers = sorted({p["layer"] for p in priors}, key=lambda x: -1 if x is None else x)
    ncol = min(4, len(layers))
    nrow = math.ceil(len(layers) / ncol)
    fig, axes = plt.subplots(nrow, ncol, figsize=(4.2 * ncol, 3.2 * nrow), squeeze=False)
    d = torch.logspace(0, math.log10(max(2, max_distance)), 200, dtype=torch.float64)
    for k, layer in enumerate(layers):
        ax = axes[k // ncol][k % ncol]
        heads = [p for p in priors if p["layer"] == layer]
        bias = ggd_bias([p["theta_alpha"] for p in heads], [p["theta_beta"] for p in heads], d,
                        eps=heads[0].get("eps", 1e-5))
        for p, b in zip(heads, bias):
            flat = p["beta"] <= 0
            a = p["alpha"]
            a_txt = "inf" if not math.isfinite(a) else (f"{a:.3g}" if a < 1e6 else f"{a:.1e}")
            label = f"h{p['head']}{'*' if flat else ''} a={a_txt} b={p['beta']:.2f}"
            ax.plot(d.numpy(), b.clamp(min=-100).numpy(), ls="--" if flat else "-", lw=1.2, label=label)
        ax.set_xscale("log")
        ax.set_yscale("symlog", linthresh=1.0)  # small biases stay visible next to -100
        ax.set_ylim(-110, 0.5)
        ax.set_title(f"layer {layer}" if layer is not None else "shared prior", fontsize=9)
        ax.set_xlabel("distance |i - j| (tokens)")
        ax.set_ylabel("bias")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=5, ncol=1 if len(heads) <= 8 else 2)
    for k in range(len(layers), nrow * ncol):
        axes[k // ncol][k % ncol].axis("off")
    fig.suptitle(f"{title}\nbias = -exp(theta_a) (d+eps)^theta_b = -|d/alpha|^beta;  "
                 "beta = theta_b, alpha = exp(-theta_a/theta_b);  * / dashed: beta <= 0", fontsize=9,
                 y=1.0 + 0.08 / nrow)
    return save_figure(fig, path)


def priors_table(priors: Iterable[Mapping]) -> str:
    """A markdown table of the GGD readout (one row per layer/head)."""
    lines = ["| layer | head | theta_alpha | theta_beta | alpha | beta | beta<=0 |", "|---|---|---|---|---|---|---|"]
    for p in priors:
        a = p["alpha"]
        lines.append(f"| {p['layer']} | {p['head']} | {p['theta_alpha']:.3f} | {p['theta_beta']:.3f} | "
                     f"{'inf' if not math.isfinite(a) else f'{a:.4g}'} | {p['beta']:.3f} | "
                     f"{'yes' if p['beta'] <= 0 else ''} |")
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------- attention maps

@torch.no_grad()
def attention_maps(model, input_ids) -> torch.Tensor:
    """Attention probabilities of one sequence: float32 ``[layers, heads, T, T]`` (CPU), from the
    model's ``output_attentions=True`` (BAM: :func:`posbias.attention.attend` with ``return_probs``,
    prior, SSMax and masks included; Hugging Face models: eager attention)."""
    ids = torch.as_tensor(input_ids, dtype=torch.long)
    if ids.dim() == 1:
        ids = ids[None]
    ids = ids[:1].to(next(model.parameters()).device)
    try:
        out = model(input_ids=ids, output_attentions=True, use_cache=False)
    except (TypeError, ValueError, NotImplementedError) as e:
        raise RuntimeError(f"{type(model).__name__} cannot return attention probabilities: {e}") from None
    atts = getattr(out, "attentions", None)
    if not atts or not all(isinstance(a, torch.Tensor) for a in atts):
        raise RuntimeError(
            f"{type(model).__name__} returned no attention probabilities; load it with "
            "attn_implementation='eager'"
        )
    return torch.stack([a[0].float().cpu() for a in atts])


def plot_attention_maps(attn, path: str | Path, *, layers: Sequence[int] | None = None,
                        heads: Sequence[int] | None = None, title: str = "attention",
                        marks: Mapping[str, int] | None = None, max_tokens: int = 1024) -> Path:
    """Grid of attention maps (rows = layers, columns = heads); log-scaled colour.

    Args:
        attn: ``[layers, heads, T, T]`` probabilities (e.g. from :func:`attention_maps`).
        marks: named token positions (e.g. ``{"needle": 120, "question": 400}``) drawn as lines.
        max_tokens: longer maps are average-pooled down to about this size for display.
    """
    a = torch.as_tensor(attn).float()
    if a.dim() != 4:
        raise ValueError(f"expected attention [layers, heads, T, T], got shape {tuple(a.shape)}")
    layers = list(range(a.shape[0])) if layers is None else list(layers)
    heads = list(range(a.shape[1])) if heads is None else list(heads)
    T = a.shape[-1]
    pool = max(1, math.ceil(T / max_tokens))
    fig, axes = plt.subplots(len(layers), len(heads), figsize=(2.2 * len(heads), 2.2 * len(layers)), squeeze=False)
    for r, li in enumerate(layers):
        for c, hi in enumerate(heads):
            m = a[li, hi]
            if pool > 1:
                m = torch.nn.functional.avg_pool2d(m[None, None], pool, ceil_mode=True)[0, 0]
            ax = axes[r][c]
            ax.imshow(torch.log10(m.clamp(min=1e-6)).numpy(), vmin=-6, vmax=0, cmap="viridis",
                      interpolation="nearest")
            for _, pos in (marks or {}).items():
                ax.axvline(pos / pool, color="r", lw=0.6)
            ax.set_xticks([])
            ax.set_yticks([])
            if r == 0:
                ax.set_title(f"head {hi}", fontsize=8)
            if c == 0:
                ax.set_ylabel(f"layer {li}", fontsize=8)
    marks_txt = ", ".join(f"{k}@{v}" for k, v in (marks or {}).items())
    fig.suptitle(f"{title} (log10 prob; rows = queries, cols = keys; T={T}{'; ' + marks_txt if marks_txt else ''})",
                 fontsize=9)
    return save_figure(fig, path)
