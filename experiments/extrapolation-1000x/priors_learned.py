"""What the positional priors of the 128-token models learned, per layer and head (docs/results/extrapolation-1000x).

For every model folder given as LABEL=PATH, reads each head's learned bias (GGD, KERPLE, FIRE, ALiBi alike,
through ``posbias.study.priors.prior_curves``) on a needle at depth 0, i.e. a key at distance L from a query at
position L, for L = the training context (128) and L = 1000x (128,000 tokens), and writes:

- ``priors.json``: per head the bias at both lengths, the drop between them (``far_drop`` = b(128,000) - b(128),
  in logits; 0 for a head that treats 1000x as it treats the training edge) and the effective power of distance
  between them (``beta_eff`` = slope of log|b| against log d; exactly GGD's beta for d >> eps);
- ``priors.md``: per model the heads in each band of the BAM authors' reading of GGD's beta (local: beta > 0,
  retrieval: -0.6 <= beta <= 0, aggressive: beta < -0.6; ``beta_eff`` for the other priors), and per layer the
  heads that lose less than 1 logit on the depth-0 needle from 128 to 128,000 tokens ("reach").

usage: priors_learned.py --out DIR LABEL=MODEL_FOLDER [LABEL=MODEL_FOLDER ...]
"""
from __future__ import annotations

import argparse
import math
from pathlib import Path

import torch

from posbias.models import load_model
from posbias.study.priors import prior_curves
from posbias.utils.io import atomic_write_json, atomic_write_text

TRAIN, FAR = 128, 128_000
REACH = 1.0  # logits: a head "reaches" 1000x when the depth-0 needle loses less than this from 128 to 128,000


def band(beta: float) -> str:
    """The BAM authors' bands of GGD's beta: local (> 0), retrieval ([-0.6, 0]), aggressive (< -0.6)."""
    return "local" if beta > 0 else ("retrieval" if beta >= -0.6 else "aggressive")


def beta_eff(b_near: float, b_far: float) -> float | None:
    """Slope of log|bias| against log distance between TRAIN and FAR; None unless both biases are negative."""
    if b_near >= 0 or b_far >= 0:
        return None
    return math.log(b_far / b_near) / math.log(FAR / TRAIN)


def heads(model) -> list[dict]:
    """Per layer and head: the bias on a depth-0 needle at TRAIN and at FAR tokens, far_drop, beta_eff."""
    near = prior_curves(model, [TRAIN], query_position=TRAIN)
    far = prior_curves(model, [FAR], query_position=FAR)
    out = []
    for a, b in zip(near, far):
        bn, bf = a["bias"][0], b["bias"][0]
        be = beta_eff(bn, bf)
        out.append({"layer": a["layer"], "head": a["head"], "bias_at_train": bn, "bias_at_1000x": bf,
                    "far_drop": bf - bn, "beta_eff": be, "band": None if be is None else band(be),
                    "reach": bf - bn > -REACH, "params": a["params"]})
    return out


def model_rows(label: str, hs: list[dict]) -> str:
    """One markdown row: band counts and, per layer, the heads that reach 1000x."""
    bands = {k: sum(h["band"] == k for h in hs) for k in ("local", "retrieval", "aggressive")}
    other = sum(h["band"] is None for h in hs)
    layers = sorted({h["layer"] for h in hs}, key=lambda x: -1 if x is None else x)
    reach = " / ".join(str(sum(h["reach"] for h in hs if h["layer"] == layer)) for layer in layers)
    return (f"| {label} | {bands['local']} | {bands['retrieval']} | {bands['aggressive']} | {other} | {reach} | "
            f"{min(h['far_drop'] for h in hs):.3g} |")


def head_table(label: str, hs: list[dict]) -> str:
    lines = [f"### {label}", "", "| layer | head | b(128) | b(128,000) | drop | beta_eff | band | reaches |",
             "|---|---|---|---|---|---|---|---|"]
    for h in hs:
        be = "" if h["beta_eff"] is None else f"{h['beta_eff']:.3f}"
        lines.append(f"| {h['layer']} | {h['head']} | {h['bias_at_train']:.3g} | {h['bias_at_1000x']:.3g} | "
                     f"{h['far_drop']:.3g} | {be} | {h['band'] or '-'} | {'yes' if h['reach'] else ''} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("models", nargs="+", help="LABEL=MODEL_FOLDER")
    args = p.parse_args(argv)
    pairs = [m.split("=", 1) for m in args.models]
    if any(len(x) != 2 for x in pairs):
        p.error("give each model as LABEL=MODEL_FOLDER")
    result = {}
    for label, folder in pairs:
        model, _ = load_model(folder, require_rope=False)
        with torch.no_grad():
            result[label] = heads(model)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_json(out / "priors.json", {"train": TRAIN, "far": FAR, "reach_logits": REACH, "models": result})
    n_layers = max(len({h["layer"] for h in hs}) for hs in result.values())
    md = [f"Heads per band (beta_eff between {TRAIN} and {FAR:,} tokens; '-' = bias not negative at both) and, per "
          f"layer, heads whose depth-0 needle loses < {REACH:g} logit from {TRAIN} to {FAR:,} tokens.", "",
          "| model | local (> 0) | retrieval ([-0.6, 0]) | aggressive (< -0.6) | - | "
          f"reach per layer (0..{n_layers - 1}) | largest drop |", "|---|---|---|---|---|---|---|"]
    md += [model_rows(label, hs) for label, hs in result.items()]
    md += ["", *[head_table(label, hs) for label, hs in result.items()]]
    atomic_write_text(out / "priors.md", "\n".join(md))
    print("\n".join(md[:len(result) + 4]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
