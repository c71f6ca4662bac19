"""MoICE (Mixture of In-Context Experts, Lin et al. 2024): every RoPE base is an expert.

One router per layer, shared by the layer's heads, is applied per head and token on the query
rotated with the layer's own base (the reference code routes on q after RoPE with its first base):
``logits = gate2(act(gate1(q)) * gate3(q))``; the top-k experts are kept with renormalised softmax
weights; attention is computed once per selected base and the outputs are mixed with those weights.
Keys are cached before RoPE (see :mod:`posbias.methods.rope_attention`); each expert's rotated keys are
kept between decoding steps (``rotated_cache``). Only the routers are trained
(:func:`posbias.training.moice.train_routers`), with the LM loss plus a Switch-style load-balancing
loss (coef 0.3), on general text.

Defaults are the reference run's (``docs/methods/baselines-reference.md``): 7 experts with the bases
10000, 17500, 18000, 19000, 20000, 22500, 25000 relative to 10000 (multipliers of each layer's own
base), dense routing (top-k 7; the load-balancing loss is then the constant 7 and has no gradient,
as in the reference), router hidden width = number of experts, weights drawn from normal(0, 0.02).

Router files: a folder (or its ``routers.safetensors``) holding ``routers.safetensors`` and
``moice_config.json`` (bases as multipliers of theta, top_k, hidden size, head_dim, layers).
"""
from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Sequence

import torch
from safetensors.torch import load_file, save
from torch import nn

from posbias.architecture.layers import execution_device, get_decoder_layers
from posbias.architecture.rope_layout import rope_layout
from posbias.methods import rope_attention as A
from posbias.methods.registry import MethodHandle, as_bool, as_layer_indices, as_list, register_method
from posbias.utils.io import atomic_write_bytes, atomic_write_json
from posbias.utils.options import check_int

DEFAULT_MULTIPLIERS = (1.0, 1.75, 1.8, 1.9, 2.0, 2.25, 2.5)  # the reference's 10000 .. 25000 / 10000
DEFAULT_TOP_K = 7  # dense, as the reference run
INIT_STD = 0.02  # Hugging Face's initializer_range, which the reference's gates get
WEIGHTS_FILE = "routers.safetensors"
CONFIG_FILE = "moice_config.json"


class Router(nn.Module):
    """gate2(act(gate1(q)) * gate3(q)) -> one logit per expert."""

    def __init__(self, head_dim: int, hidden: int, n_experts: int):
        super().__init__()
        self.gate1 = nn.Linear(head_dim, hidden, bias=False)
        self.gate3 = nn.Linear(head_dim, hidden, bias=False)
        self.gate2 = nn.Linear(hidden, n_experts, bias=False)
        self.act = nn.SiLU()
        for lin in (self.gate1, self.gate2, self.gate3):
            nn.init.normal_(lin.weight, mean=0.0, std=INIT_STD)

    def forward(self, q: torch.Tensor) -> torch.Tensor:
        return self.gate2(self.act(self.gate1(q)) * self.gate3(q))


class MoICERouters(nn.Module):
    """The routers of the patched layers (``routers[str(layer)]``) and their configuration."""

    def __init__(self, layers: Sequence[int], head_dim: int, hidden: int, multipliers: Sequence[float],
                 top_k: int):
        super().__init__()
        self.layers = [int(i) for i in layers]
        self.head_dim, self.hidden, self.top_k = int(head_dim), int(hidden), int(top_k)
        self.multipliers = [float(m) for m in multipliers]
        self.routers = nn.ModuleDict({str(i): Router(head_dim, hidden, len(self.multipliers)) for i in self.layers})

    def place_with(self, decoder_layers) -> MoICERouters:
        """Each router on the device where the decoder layer it routes computes (a model split over
        several GPUs by ``--device shard`` keeps its layers, and so their routers, on different devices;
        a layer offloaded to the CPU or disk keeps its weights on ``meta``)."""
        for i, router in self.routers.items():
            router.to(execution_device(decoder_layers[int(i)]))
        return self

    def config(self) -> dict:
        return {"format": "posbias-moice-routers", "version": 1, "layers": self.layers, "head_dim": self.head_dim,
                "hidden": self.hidden, "top_k": self.top_k, "multipliers": self.multipliers}


def save_routers(routers: MoICERouters, out_dir: str | Path, extra: dict | None = None) -> Path:
    """Write ``routers.safetensors`` + ``moice_config.json`` into ``out_dir``; returns the folder."""

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().cpu().contiguous() for k, v in routers.state_dict().items()}
    atomic_write_bytes(out / WEIGHTS_FILE, save(state))
    cfg = routers.config()
    if extra:
        cfg["training"] = extra
    atomic_write_json(out / CONFIG_FILE, cfg)
    return out


def router_files(path: str | Path) -> tuple[Path, Path]:
    """``(weights, config)`` of routers saved by :func:`save_routers` at ``path`` (their folder or the
    safetensors file); :class:`ValueError` when either is missing."""
    p = Path(str(path)).expanduser()
    folder = p if p.is_dir() else p.parent
    weights = p if p.is_file() else folder / WEIGHTS_FILE
    cfg_path = folder / CONFIG_FILE
    if not weights.exists() or not cfg_path.exists():
        raise ValueError(f"moice: router files not found at {p} (need {WEIGHTS_FILE} and {CONFIG_FILE}; "
                         "train them with `posbias train-moice`)")
    return weights, cfg_path


def load_routers(path: str | Path) -> MoICERouters:
    """Load routers saved by :func:`save_routers` (a folder or its safetensors file)."""

    weights, cfg_path = router_files(path)
    folder = cfg_path.parent
    try:
        cfg = json.loads(cfg_path.read_text())
        routers = MoICERouters(cfg["layers"], cfg["head_dim"], cfg["hidden"], cfg["multipliers"], cfg["top_k"])
        routers.load_state_dict(load_file(str(weights)))
    except (KeyError, json.JSONDecodeError, RuntimeError) as e:
        raise ValueError(f"moice: cannot read routers from {folder}: {e}") from None
    return routers


class MoICE:
    """Attention function and bookkeeping (load-balancing statistics) of an applied MoICE."""

    def __init__(self, model, routers: MoICERouters, rotated_cache: bool = True):
        self.layout = A.check_self_rotating(model, routers.layers, "moice")
        self.rotated = A.RotatedKeyCache() if rotated_cache else None  # each expert's keys, kept between steps
        self.routers = routers
        self.multipliers = list(routers.multipliers)
        self.collect_aux = False
        self.aux: list[torch.Tensor] = []
        self.last_weights: dict[int, torch.Tensor] = {}

    def _inv(self, layer: int, e: int, device) -> torch.Tensor:
        """inv_freq of expert ``e`` in ``layer``: the layer's own base times the expert's multiplier."""
        rope = self.layout.layers[layer]
        inv = self.layout.inv_freq(rope.layer_type).to(device)
        return A.base_inv_freq(inv, rope.theta, rope.theta * self.multipliers[e])

    def attention(self, module, query, key, value, attention_mask, scaling=None, native=None, **kwargs):
        q_len = query.shape[2]
        scaling = module.scaling if scaling is None else scaling
        router = self.routers.routers[str(module.layer_idx)]
        n_exp, k = len(self.multipliers), min(self.routers.top_k, len(self.multipliers))

        q_pos, k_pos = A.query_key_positions(query, key, kwargs.get("position_ids"))
        routed = self._router_input(module.layer_idx, query, q_pos).to(router.gate1.weight.dtype)
        logits = router(routed)  # (B, H, q, E)
        probs = torch.softmax(logits.float(), dim=-1)
        top_p, top_i = probs.topk(k, dim=-1)
        top_w = top_p / top_p.sum(-1, keepdim=True)
        weights = torch.zeros_like(probs).scatter(-1, top_i, top_w)  # (B, H, q, E)
        if self.collect_aux:
            # Mixtral / the reference's form: each selected expert counts 1 (so dense top-7 gives the constant 7)
            frac = torch.zeros_like(probs).scatter(-1, top_i, 1.0).reshape(-1, n_exp).mean(0)
            mean_p = probs.reshape(-1, n_exp).mean(0)
            self.aux.append(n_exp * (frac.detach() * mean_p).sum())
        self.last_weights[module.layer_idx] = weights.detach()

        att_scale = self.layout.layers[module.layer_idx].attention_scaling
        expert_weights = weights.transpose(1, 2)  # (B, q, H, E), the layout of the attention output
        # dense routing uses every expert: no host sync to find out
        used = [True] * n_exp if k == n_exp else (weights.reshape(-1, n_exp) > 0).any(0).tolist()
        out = None
        for e in range(n_exp):
            if not used[e]:
                continue
            inv = self._inv(module.layer_idx, e, query.device)[None, None]  # (1, 1, d/2)
            cq, sq = A.cos_sin(q_pos[:, None, :], inv, att_scale, query.dtype)  # (B, 1, q, d)

            def rotate_keys(start: int, inv=inv) -> torch.Tensor:  # (B, KV, kv - start, d) under expert e's base
                ck, sk = A.cos_sin(k_pos[:, None, start:], inv, att_scale, query.dtype)
                return A.rotate(key[:, :, start:], ck, sk)

            rotated = rotate_keys(0) if self.rotated is None else self.rotated.keys(module, e, key, q_len, rotate_keys)
            o = A.attend_as_model(native, module, A.rotate(query, cq, sq), rotated, value, attention_mask, scaling,
                                  **kwargs)  # (B, q, H, d)
            term = expert_weights[..., e, None].to(o.dtype) * o
            out = term if out is None else out + term
        return out, None

    def _router_input(self, layer: int, query: torch.Tensor, q_pos: torch.Tensor) -> torch.Tensor:
        """The query (B, H, q, d) rotated with the layer's own base at its positions."""
        rope = self.layout.layers[layer]
        inv = self.layout.inv_freq(rope.layer_type).to(query.device)[None, None]
        cq, sq = A.cos_sin(q_pos[:, None, :], inv, rope.attention_scaling, query.dtype)
        return A.rotate(query, cq, sq)

    def aux_loss(self) -> torch.Tensor:
        """Mean Switch load-balancing loss over the layers of the last forward (then cleared)."""
        if not self.aux:
            return torch.zeros(())
        last = self.aux[-1].device  # the layers' terms are on their own devices under --device shard
        loss = torch.stack([a.to(last) for a in self.aux]).mean()
        self.aux = []
        return loss


def _saved_routers(routers: str, head_dim: int, n_layers: int, top_k: int | None) -> "MoICERouters":
    """Routers saved by ``posbias train-moice``, checked against the model; ``top_k`` overrides theirs."""
    mods = load_routers(routers)
    if mods.head_dim != head_dim or max(mods.layers, default=-1) >= n_layers:
        raise ValueError(f"moice: routers at {routers} were trained for head_dim {mods.head_dim} and layers "
                         f"{mods.layers}; this model has head_dim {head_dim} and {n_layers} layers")
    if top_k is not None:
        mods.top_k = min(top_k, len(mods.multipliers))
    return mods


def _expert_multipliers(model, thetas: list[float], multipliers, bases) -> list[float]:
    """The experts' RoPE bases as multiples of the model's base (from ``bases`` on a one-base model)."""
    if bases is not None:
        if len(thetas) > 1:
            raise ValueError(f"moice: {type(model).__name__} uses several RoPE bases ({thetas}); give the "
                             "experts as multipliers of each layer's own base, not as absolute bases")
        mult = [x / thetas[0] for x in as_list(bases, float, "moice: bases")]
    else:
        mult = as_list(multipliers, float, "moice: multipliers") or list(DEFAULT_MULTIPLIERS)
    if not mult or any(not m > 0 for m in mult):
        raise ValueError(f"moice: need at least one expert base and all > 0, got {mult}")
    return mult


@register_method("moice", "MoICE: per-head/token router over RoPE bases (options routers=PATH, top_k, "
                           "multipliers/bases, hidden, layers, seed)", aliases=("mixture-of-in-context-experts",))
def apply_moice(model, routers: str | None = None, top_k: int | None = None, multipliers: Sequence[float] | None = None,
                bases: Sequence[float] | None = None, hidden: int | None = None,
                layers: Sequence[int] | None = None, seed: int = 0, rotated_cache: bool = True) -> MethodHandle:
    """Apply MoICE; with ``routers=PATH`` the saved routers (and their bases / top_k) are used,
    otherwise freshly initialised (untrained) routers are created (for training or tests).

    ``top_k`` defaults to the saved value (routers file) or 7 (dense); given explicitly it overrides the
    saved one. ``multipliers`` / ``bases`` / ``hidden`` / ``layers`` define new routers: given together
    with ``routers=PATH`` (whose file fixes them) they are refused, never silently ignored.
    ``rotated_cache`` keeps each expert's rotated keys between decoding steps (``False``: re-rotate
    the whole cache at every step; same outputs).
    """
    rotated_cache = as_bool(rotated_cache, "moice: rotated_cache")
    top_k = None if top_k is None else check_int("moice: top_k", top_k)
    n_layers = len(get_decoder_layers(model))
    config = model.config
    head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads)
    thetas = sorted(set(rope_layout(model).thetas.values()))
    if routers is not None:
        clash = [name for name, v in (("multipliers", multipliers), ("bases", bases), ("hidden", hidden),
                                      ("layers", layers)) if v is not None]
        if clash:
            raise ValueError(f"moice: {', '.join(clash)} cannot be combined with routers={routers}: the routers "
                             "file fixes them (train new routers to change them)")
        mods = _saved_routers(routers, head_dim, n_layers, top_k)
    else:
        warnings.warn("moice: no routers=PATH given, using freshly initialised (untrained) routers; "
                      "train them with `posbias train-moice`", stacklevel=3)
        mult = _expert_multipliers(model, thetas, multipliers, bases)
        top_k = DEFAULT_TOP_K if top_k is None else top_k
        layers = as_layer_indices(list(range(n_layers)) if layers is None else layers, n_layers, "moice: layers")
        gen_state = torch.random.get_rng_state()
        torch.manual_seed(int(seed))
        mods = MoICERouters(layers, head_dim, int(hidden or len(mult)), mult, min(top_k, len(mult)))
        torch.random.set_rng_state(gen_state)
    mods.place_with(get_decoder_layers(model)).eval()
    state = MoICE(model, mods, rotated_cache)
    patch = A.RopeAttentionPatch(model, mods.layers, state.attention)
    opts = {"routers": None if routers is None else str(routers), "top_k": mods.top_k,
            "multipliers": mods.multipliers, "layers": mods.layers, "hidden": mods.hidden,
            "rotated_cache": rotated_cache}
    if len(thetas) == 1:
        opts["bases"] = [thetas[0] * m for m in mods.multipliers]
    return MethodHandle("moice", model, remove_fn=patch.remove, options=opts,
                        state={"moice": state, "routers": mods})
