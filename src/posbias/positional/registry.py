"""Registry of positional schemes, looked up by name.

A scheme is one of four *kinds*:

* ``"rotary"``   - a rotation applied to queries and keys (RoPE);
* ``"absolute"`` - an embedding added to the token embeddings (sinusoidal);
* ``"none"``     - nothing at all (NoPE);
* ``"bias"``     - an additive per-head bias ``b[h, i, j]`` on the attention logits
  (ALiBi, GGD-BAM, KERPLE, FIRE), built for any block of query x key positions.

A bias module offers ``forward(q_pos, k_pos) -> [H, i, j]``; a distance-only one also ``block(...)``
(a Toeplitz view for contiguous positions); ``score_fn()`` gives the per-element form
``f(h, dist, q_pos)`` of the FlexAttention path; ``project_()`` (KERPLE) puts constrained parameters
back into their domain after an optimizer step (:func:`project_parameters`).

``get_scheme(name)`` returns the :class:`SchemeSpec`; ``spec.build(**kwargs)`` makes the module.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch.nn as nn

KINDS = ("rotary", "absolute", "none", "bias")


@dataclass(frozen=True)
class SchemeSpec:
    """A registered positional scheme: its ``name``, ``kind`` and module factory ``build``."""

    name: str
    kind: str
    build: Callable[..., nn.Module | None]
    doc: str = ""


SCHEMES: dict[str, SchemeSpec] = {}


def register_scheme(name: str, kind: str, build: Callable[..., nn.Module | None], doc: str = "") -> SchemeSpec:
    """Register ``build`` under ``name`` (a scheme of ``kind``, one of :data:`KINDS`)."""
    if kind not in KINDS:
        raise ValueError(f"unknown scheme kind {kind!r}; known kinds: {', '.join(KINDS)}")
    spec = SchemeSpec(name=name, kind=kind, build=build, doc=doc)
    SCHEMES[name] = spec
    return spec


def project_parameters(model: nn.Module) -> None:
    """Clamp the parameters of every positional module of ``model`` that has constraints (``project_()``,
    e.g. KERPLE's r > 0) back into their domain: the projected gradient step, run after every optimizer step."""
    for module in model.modules():
        project = getattr(module, "project_", None)
        if callable(project):
            project()


def get_scheme(name: str) -> SchemeSpec:
    """Return the scheme registered as ``name``; an unknown name raises ``ValueError`` listing the known ones."""
    if name not in SCHEMES:
        raise ValueError(f"unknown positional scheme {name!r}; known schemes: {', '.join(sorted(SCHEMES))}")
    return SCHEMES[name]
