"""Llama-style decoder with a pluggable positional scheme and normaliser (BAM experiments).

Pre-norm blocks ``x + Attn(RMSNorm(x))``, ``x + SwiGLU(RMSNorm(x))`` (Touvron et al. 2023); the
positional scheme is RoPE (q/k rotation), sinusoidal (added to the embeddings), NoPE, ALiBi or
a learnable prior as an additive attention bias (GGD of BAM, Bianchessi et al. 2025; KERPLE, Chi et al.
2022; FIRE, Li et al. 2024); the
normaliser is softmax or SSMax (Nakanishi 2025). Attention goes through
:func:`posbias.attention.attend`, so long inputs run query-chunked with memory linear in length.

Shapes: ``input_ids`` [b, n]; ``doc_ids`` [b, n] (packed documents; attention and SSMax counts
stay inside a document); ``attention_mask`` [b, past + n] (1 = real token).
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F
from transformers import GenerationMixin, PreTrainedModel
from transformers import initialization as init
from transformers.cache_utils import DynamicCache
from transformers.modeling_outputs import BaseModelOutputWithPast, CausalLMOutputWithPast

from posbias.attention import SSMax, attend
from posbias.positional import FIREBias, GGDBias, KerpleBias, get_scheme

from .config import BamConfig


def own_positions(positions: torch.Tensor, doc_ids: torch.Tensor | None = None,
                  attention_mask: torch.Tensor | None = None) -> torch.Tensor:
    """Every token's own position, Long [b|1, n]: restarting at every packed document (``doc_ids`` [b, n]),
    counted over the real tokens of a left-padded row (``attention_mask`` [b, past + n]), else
    ``positions`` (Long [n], the tokens' indices in the sequence). The sinusoidal scheme's positions and
    FIRE's query positions."""
    if doc_ids is not None:
        b, n = doc_ids.shape
        start = torch.ones_like(doc_ids, dtype=torch.bool)
        start[:, 1:] = doc_ids[:, 1:] != doc_ids[:, :-1]
        idx = torch.arange(n, device=doc_ids.device).expand(b, n)
        first = torch.where(start, idx, torch.zeros_like(idx)).cummax(-1).values
        return idx - first
    if attention_mask is not None:
        return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)[:, -len(positions):]
    return positions[None]


class BamRMSNorm(nn.Module):
    """RMSNorm (Zhang & Sennrich 2019), computed in float32. [..., d] -> [..., d]."""

    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (self.weight.float() * xf).to(x.dtype)


class BamMLP(nn.Module):
    """SwiGLU feed-forward (Shazeer 2020): ``down(silu(gate(x)) * up(x))``."""

    def __init__(self, config: BamConfig):
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class BamAttention(nn.Module):
    """Multi-head (optionally grouped-query) attention; the positional bias module is passed in."""

    def __init__(self, config: BamConfig, layer_idx: int):
        super().__init__()
        self.layer_idx = layer_idx
        self.n_heads = config.num_attention_heads
        self.n_kv = config.num_key_value_heads
        self.head_dim = config.head_dim
        self.q_proj = nn.Linear(config.hidden_size, self.n_heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(config.hidden_size, self.n_kv * self.head_dim, bias=False)
        self.v_proj = nn.Linear(config.hidden_size, self.n_kv * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.n_heads * self.head_dim, config.hidden_size, bias=False)
        spec = get_scheme(config.pe)
        self.rotary = spec.build(head_dim=self.head_dim, theta=config.rope_theta) if spec.kind == "rotary" else None
        self.ssmax = (SSMax(self.n_heads, config.ssmax_init, scope=getattr(config, "ssmax_scope", "all"))
                      if config.normaliser == "ssmax" else None)

    def forward(self, x, *, positions, bias, doc_ids, key_mask, cache, backend, chunk_size, probs=None,
                query_positions=None, query_rows: int = 0):
        """x: [b, n, hidden] -> [b, n, hidden], or [b, query_rows, hidden] with ``query_rows`` > 0: only the
        last ``query_rows`` tokens query (keys and values, and the cache, still cover all ``n``).
        With a list ``probs`` the attention probabilities [b, h, i, j] are appended;
        ``query_positions`` [b, n]: the tokens' own positions, for a query-dependent prior (FIRE)."""
        b, n, _ = x.shape
        rows = query_rows or n
        q = self.q_proj(x[:, n - rows:]).view(b, rows, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, n, self.n_kv, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, n, self.n_kv, self.head_dim).transpose(1, 2)
        if query_positions is not None:
            query_positions = query_positions[:, n - rows:]
        if self.rotary is not None:
            q, k = self.rotary(q, k, positions[n - rows:], positions)
        if cache is not None:
            k, v = cache.update(k, v, self.layer_idx)
        out = attend(q, k, v, bias=bias, doc_ids=doc_ids, normaliser=self.ssmax, key_mask=key_mask,
                     backend=backend, chunk_size=chunk_size, return_probs=probs is not None,
                     query_positions=query_positions)
        if probs is not None:
            out, p = out
            probs.append(p)
        return self.o_proj(out.transpose(1, 2).reshape(b, rows, self.n_heads * self.head_dim))


class BamDecoderLayer(nn.Module):
    def __init__(self, config: BamConfig, layer_idx: int):
        super().__init__()
        self.input_layernorm = BamRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = BamAttention(config, layer_idx)
        self.post_attention_layernorm = BamRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = BamMLP(config)
        self.ffn_chunk = config.ffn_chunk_size

    def forward(self, x, query_rows: int = 0, **kw):
        """x: [b, n, hidden] -> [b, n, hidden], or its last ``query_rows`` rows (see :class:`BamAttention`)."""
        x = x[:, x.shape[1] - (query_rows or x.shape[1]):] + self.self_attn(self.input_layernorm(x),
                                                                              query_rows=query_rows, **kw)
        n = x.shape[1]
        if self.ffn_chunk and n > self.ffn_chunk:  # position-wise, so pieces are exact
            return torch.cat([p + self.mlp(self.post_attention_layernorm(p)) for p in x.split(self.ffn_chunk, 1)], 1)
        return x + self.mlp(self.post_attention_layernorm(x))


class BamPreTrainedModel(PreTrainedModel):
    config_class = BamConfig
    config: BamConfig
    base_model_prefix = "model"
    _no_split_modules = ["BamDecoderLayer"]
    supports_gradient_checkpointing = False

    def _init_weights(self, module):
        super()._init_weights(module)  # Linear / Embedding normal(0, initializer_range), RMSNorm ones
        if isinstance(module, GGDBias):
            alpha, beta = module.initial_values()
            init.copy_(module.theta_alpha, alpha)
            init.copy_(module.theta_beta, beta)
        elif isinstance(module, (KerpleBias, FIREBias)):  # their papers' initialisation (random draws)
            for name, value in module.initial_state().items():
                init.copy_(getattr(module, name), value)
        elif isinstance(module, SSMax):
            init.constant_(module.s, module.init)
        elif isinstance(module, nn.Embedding) and getattr(self.config, "embed_init_std", None):
            init.normal_(module.weight, mean=0.0, std=self.config.embed_init_std)
            if module.padding_idx is not None:
                init.zeros_(module.weight[module.padding_idx])


class BamModel(BamPreTrainedModel):
    """The decoder stack (no LM head). Priors live in ``self.priors`` (one per layer, or one shared)."""

    def __init__(self, config: BamConfig):
        super().__init__(config)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size, config.pad_token_id)
        spec = get_scheme(config.pe)
        self.abs_pe = spec.build(hidden_size=config.hidden_size, base=config.sinusoidal_base) \
            if spec.kind == "absolute" else None
        self.priors = None
        if spec.kind == "bias":
            kw = dict(num_heads=config.num_attention_heads, ggd_init=config.ggd_init,
                      ggd_theta_alpha=config.ggd_theta_alpha, ggd_theta_beta=config.ggd_theta_beta,
                      ggd_eps=config.ggd_eps, fire_hidden=getattr(config, "fire_hidden", 32),
                      fire_threshold=getattr(config, "fire_threshold", 512.0))
            first = spec.build(**kw)
            # a learnable prior has one module per layer (unless shared); a fixed one (ALiBi) is built once
            learnable = any(True for _ in first.parameters())
            n = config.num_hidden_layers if learnable and not config.ggd_share_layers else 1
            self.priors = nn.ModuleList([first] + [spec.build(**kw) for _ in range(n - 1)])
        self.layers = nn.ModuleList(BamDecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = BamRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_init()

    def get_input_embeddings(self):
        return self.embed_tokens

    def set_input_embeddings(self, value):
        self.embed_tokens = value

    def prior(self, layer: int):
        """The positional bias module of ``layer`` (``None`` for rope / sinusoidal / nope)."""
        if self.priors is None:
            return None
        return self.priors[layer if len(self.priors) > 1 else 0]

    def _query_dependent_prior(self) -> bool:
        """Whether the prior reads each query's own position (FIRE)."""
        return self.priors is not None and bool(getattr(self.priors[0], "query_dependent", False))

    def forward(self, input_ids=None, attention_mask=None, doc_ids=None, position_ids=None, cache=None,
                inputs_embeds=None, use_cache=None, attn_backend=None, chunk_size=None, output_attentions=False,
                rows_to_keep: int = 0, **kwargs):
        """Hidden states [b, n, hidden] after the final norm; with ``rows_to_keep`` = k > 0 only the last
        k rows [b, k, hidden]: the last layer then computes queries, MLP and output for those rows alone
        (its keys and values, and the cache, cover every position), a 1 / num_layers saving when only the
        last logits are wanted (teacher-forced scoring, prefill)."""
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("give exactly one of input_ids and inputs_embeds")
        x = self.embed_tokens(input_ids) if inputs_embeds is None else inputs_embeds
        if getattr(self.config, "embed_scale", None):
            x = x * self.config.embed_scale
        b, n = x.shape[:2]
        if use_cache and cache is None:
            cache = DynamicCache()
        past = cache.get_seq_length() if cache is not None else 0
        if doc_ids is not None:
            if past:
                raise ValueError("doc_ids cannot be combined with a non-empty KV cache")
            if doc_ids.shape != (b, n):
                raise ValueError(f"doc_ids must have shape {(b, n)}, got {tuple(doc_ids.shape)}")
        key_mask = None
        if attention_mask is not None:
            if attention_mask.dim() != 2 or attention_mask.shape[-1] != past + n:
                raise ValueError(f"attention_mask must be [batch, {past + n}] (past + new tokens)")
            if not bool(attention_mask.bool().all()):
                key_mask = attention_mask.bool()
        positions = torch.arange(past, past + n, device=x.device)
        query_positions = None
        if self.abs_pe is not None or self._query_dependent_prior():
            if position_ids is None:
                position_ids = own_positions(positions, doc_ids, attention_mask if key_mask is not None else None)
            query_positions = position_ids.expand(b, n) if self.priors is not None else None
        if self.abs_pe is not None:
            x = x + self.abs_pe(position_ids).to(x.dtype)
        backend = attn_backend or self.config.attn_backend
        chunk = chunk_size or (self.config.attn_chunk_size if backend == "chunked" else None)
        probs = [] if output_attentions else None
        last = len(self.layers) - 1
        rows = rows_to_keep if 0 < rows_to_keep < n and probs is None else 0
        for i, layer in enumerate(self.layers):
            x = layer(x, positions=positions, bias=self.prior(i), doc_ids=doc_ids, key_mask=key_mask,
                      cache=cache, backend=backend, chunk_size=chunk, probs=probs, query_positions=query_positions,
                      query_rows=rows if i == last else 0)
        return BaseModelOutputWithPast(last_hidden_state=self.norm(x), cache=cache if use_cache else None,
                                       attentions=tuple(probs) if probs is not None else None)


class BamForCausalLM(BamPreTrainedModel, GenerationMixin):
    """BAM decoder with an LM head; ``generate``, ``save_pretrained`` and ``from_pretrained`` work.

    ``forward(input_ids, doc_ids=None, labels=None, logits_to_keep=0, ...)``: ``logits_to_keep`` is
    an int (last k positions; 0 = all) or a LongTensor of positions, so long inputs need not
    materialise [n, vocab] logits. With ``labels`` the loss is next-token cross-entropy that
    ignores ``-100`` and, when ``doc_ids`` is given, the first token of every document.
    """

    _tied_weights_keys = {"lm_head.weight": "model.embed_tokens.weight"}

    def __init__(self, config: BamConfig):
        super().__init__(config)
        self.model = BamModel(config)
        self.vocab_size = config.vocab_size
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    def get_input_embeddings(self):
        return self.model.embed_tokens

    def set_input_embeddings(self, value):
        self.model.embed_tokens = value

    def get_output_embeddings(self):
        return self.lm_head

    def set_output_embeddings(self, value):
        self.lm_head = value

    def prior_parameters(self) -> list[nn.Parameter]:
        """Parameters of the positional priors and SSMax scales (no weight decay, optional own lr)."""
        return [p for name, p in self.named_parameters() if ".priors." in name or name.endswith("ssmax.s")]

    def forward(self, input_ids=None, attention_mask=None, doc_ids=None, position_ids=None, cache=None,
                inputs_embeds=None, labels=None, use_cache=None, logits_to_keep=0, attn_backend=None,
                chunk_size=None, past_key_values=None, output_attentions=False, **kwargs):
        if cache is None:
            cache = past_key_values
        if use_cache is None:
            use_cache = bool(self.config.use_cache) and not self.training and labels is None
        # only the kept logits' rows go through the last layer when nothing else needs the others
        rows = logits_to_keep if isinstance(logits_to_keep, int) and labels is None else 0
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, doc_ids=doc_ids,
                         position_ids=position_ids, cache=cache, inputs_embeds=inputs_embeds,
                         use_cache=use_cache, attn_backend=attn_backend, chunk_size=chunk_size,
                         output_attentions=output_attentions, rows_to_keep=rows)
        h = out.last_hidden_state
        loss = None
        if labels is not None:
            logits_all = self.lm_head(h).float()
            tgt = labels[:, 1:].clone()
            if doc_ids is not None:
                tgt[doc_ids[:, 1:] != doc_ids[:, :-1]] = -100
            loss = F.cross_entropy(logits_all[:, :-1].reshape(-1, logits_all.shape[-1]), tgt.reshape(-1),
                                   ignore_index=-100)
        if isinstance(logits_to_keep, int):
            hs = h[:, -logits_to_keep:] if logits_to_keep > 0 else h
        else:
            idx = torch.as_tensor(logits_to_keep, device=h.device)
            hs = h[:, idx] if idx.dim() == 1 else torch.gather(h, 1, idx[..., None].expand(-1, -1, h.shape[-1]))
        logits = self.lm_head(hs)
        return CausalLMOutputWithPast(loss=loss, logits=logits, cache=out.cache, attentions=out.attentions)
