"""Representation-structure deviation of a per-layer scaling: linear CKA per layer.

For each decoder layer, the hidden states (every token of a few prompts) of the patched model are
compared with the unpatched model's by linear CKA (Kornblith et al. 2019):
``CKA(X, Y) = ||Y^T X||_F^2 / (||X^T X||_F ||Y^T Y||_F)`` on column-centred ``X, Y``. The deviation
``1 - CKA`` is reported for the found factors and, as controls, for *noisy* versions (each factor
multiplied by ``exp(N(0, sigma))``) and *shuffled* versions (the same factors permuted over
layers). A good LPES curve is expected to change representations less than its shuffled controls.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from posbias.architecture.layers import model_device
from posbias.patching.rope_scaling import apply_layer_scaling
from posbias.utils.figures import pyplot, save_figure

__all__ = ["linear_cka", "layer_hidden_states", "cka_deviation", "analyze_scaling", "analysis_table", "plot_analysis"]


def linear_cka(x: torch.Tensor, y: torch.Tensor) -> float:
    """Linear CKA between two ``(n, d)`` representations of the same ``n`` examples."""
    x = x.double() - x.double().mean(0, keepdim=True)
    y = y.double() - y.double().mean(0, keepdim=True)
    num = (y.T @ x).norm() ** 2
    den = (x.T @ x).norm() * (y.T @ y).norm()
    return float(num / den) if den > 0 else float("nan")


@torch.no_grad()
def layer_hidden_states(model, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """Per layer output, all tokens of all ``inputs`` (1-D id tensors) stacked: ``L x (tokens, d)``."""
    per_layer: list[list[torch.Tensor]] = []
    device = model_device(model)
    for ids in inputs:
        hs = model(input_ids=ids[None].to(device), output_hidden_states=True).hidden_states[1:]
        if not per_layer:
            per_layer = [[] for _ in hs]
        for acc, h in zip(per_layer, hs):
            acc.append(h[0].float())
    return [torch.cat(a) for a in per_layer]


def cka_deviation(model, inputs, factors: Sequence[float], reference: list[torch.Tensor]) -> list[float]:
    """``1 - CKA`` per layer between the model patched with ``factors`` and ``reference``."""

    with apply_layer_scaling(model, factors):
        hs = layer_hidden_states(model, inputs)
    return [1.0 - linear_cka(a, b) for a, b in zip(reference, hs)]


def analyze_scaling(model, inputs, factors: Sequence[float], *, n_controls: int = 3, sigma: float = 0.1,
                    seed: int = 0) -> dict:
    """Deviation per layer for the found factors, ``n_controls`` noisy and shuffled versions."""
    rng = np.random.default_rng(seed)
    reference = layer_hidden_states(model, inputs)
    f = np.asarray(factors, dtype=float)
    variants = {"found": f}
    for k in range(n_controls):
        variants[f"noisy{k}"] = f * np.exp(rng.normal(0.0, sigma, size=f.shape))
    for k in range(n_controls):
        variants[f"shuffled{k}"] = rng.permutation(f)
    rows = {name: {"factors": v.tolist(), "deviation": cka_deviation(model, inputs, v.tolist(), reference)}
            for name, v in variants.items()}
    for r in rows.values():
        r["mean_deviation"] = float(np.mean(r["deviation"]))
    summary = {kind: float(np.mean([r["mean_deviation"] for n, r in rows.items() if n.startswith(kind)]))
               for kind in ("found", "noisy", "shuffled") if any(n.startswith(kind) for n in rows)}
    return {"variants": rows, "summary": summary, "sigma": sigma, "n_controls": n_controls, "seed": seed,
            "tokens": int(sum(len(i) for i in inputs))}


def analysis_table(res: dict) -> str:
    """Markdown table of :func:`analyze_scaling`'s result: mean / max / last-layer ``1 - CKA`` per variant."""
    lines = ["| variant | mean 1-CKA | max 1-CKA | last layer |", "|---|---|---|---|"]
    for name, r in res["variants"].items():
        d = r["deviation"]
        lines.append(f"| {name} | {r['mean_deviation']:.4f} | {max(d):.4f} | {d[-1]:.4f} |")
    lines.append("")
    lines.append("mean over variants: " + ", ".join(f"{k} {v:.4f}" for k, v in res["summary"].items()))
    return "\n".join(lines) + "\n"


def plot_analysis(path, res: dict) -> None:
    """``1 - CKA`` per layer: the found factors in bold, noisy and shuffled controls thin."""

    fig, ax = pyplot().subplots(figsize=(6, 3.5))
    colors = {"found": "tab:blue", "noisy": "tab:orange", "shuffled": "tab:grey"}
    for name, r in res["variants"].items():
        kind = next(k for k in colors if name.startswith(k))
        ax.plot(range(len(r["deviation"])), r["deviation"], color=colors[kind], lw=2 if kind == "found" else 1,
                alpha=1 if kind == "found" else 0.6, label=kind if name in ("found", "noisy0", "shuffled0") else None)
    ax.set_xlabel("decoder layer")
    ax.set_ylabel("1 - linear CKA vs unpatched")
    ax.legend()
    fig.tight_layout()
    save_figure(fig, path)
