"""Configuration of the BAM decoder (``model_type = "posbias-bam"``) and its size presets."""
from __future__ import annotations

import inspect

from transformers import PretrainedConfig

from posbias.positional import get_scheme
from posbias.positional.ggd import INITS as GGD_INITS

NORMALISERS = ("softmax", "ssmax")
SSMAX_SCOPES = ("all", "content")  # what SSMax's s_h log n scales: content + prior (BAM) or content only

# name -> (layers, hidden, heads, intermediate)
PRESETS: dict[str, dict] = {
    "tiny": dict(num_hidden_layers=4, hidden_size=128, num_attention_heads=4, intermediate_size=384),
    "small": dict(num_hidden_layers=6, hidden_size=384, num_attention_heads=6, intermediate_size=1024),
    "120m": dict(num_hidden_layers=12, hidden_size=768, num_attention_heads=16, intermediate_size=2048),
    "1b": dict(num_hidden_layers=24, hidden_size=2048, num_attention_heads=64, intermediate_size=5632),
}


class BamConfig(PretrainedConfig):
    """Llama-style decoder (RMSNorm, SwiGLU, pre-norm) with a pluggable positional scheme.

    Args (beyond the usual Hugging Face ones):
        pe: positional scheme, one of ``posbias.positional.SCHEMES`` (rope, sinusoidal, nope, alibi, ggd,
            kerple-log, kerple-power, fire).
        normaliser: ``"softmax"`` or ``"ssmax"`` (Scalable-Softmax, ``s_h`` per head and layer).
        ssmax_scope: ``"all"`` (BAM's order: ``(q k^T / sqrt(d) + prior) * s_h log n``) or
            ``"content"`` (``q k^T / sqrt(d) * s_h log n + prior``; the ablation of issue #16).
        rope_theta: RoPE base (500000 as the BAM RoPE baseline).
        embed_scale / embed_init_std: token embeddings x ``embed_scale`` at the input, and their std at
            initialisation (``None``: 1 and ``initializer_range``; see :meth:`from_preset` for sinusoidal).
        ggd_init / ggd_theta_alpha / ggd_theta_beta / ggd_eps: GGD prior initialisation
            (see :class:`posbias.positional.GGDBias`).
        ggd_share_layers: one learnable prior (GGD, KERPLE, FIRE) for all layers instead of one per layer
            (with ``pe="fire"`` the paper's FIRE-S).
        fire_hidden / fire_threshold: FIRE's hidden units (32) and initial threshold ``L`` (512), see
            :class:`posbias.positional.FIREBias`.
        attn_backend: ``auto`` / ``sdpa`` / ``chunked`` / ``eager`` / ``flex`` (see :func:`posbias.attention.attend`).
        attn_chunk_size: query chunk of the chunked path.
        ffn_chunk_size: longer sequences run the feed-forward in pieces of this many tokens
            (exact; bounds the [n, intermediate] activations at long inference lengths).
    """

    model_type = "posbias-bam"
    keys_to_ignore_at_inference = ["cache"]

    def __init__(self, vocab_size: int = 49152, hidden_size: int = 128, intermediate_size: int | None = None,
                 num_hidden_layers: int = 4, num_attention_heads: int = 4, num_key_value_heads: int | None = None,
                 pe: str = "ggd", normaliser: str = "softmax", rope_theta: float = 500000.0,
                 sinusoidal_base: float = 10000.0, embed_scale: float | None = None,
                 embed_init_std: float | None = None, ggd_init: str = "nope",
                 ggd_theta_alpha=None,
                 ggd_theta_beta=None, ggd_eps: float = 1e-5, ggd_share_layers: bool = False,
                 fire_hidden: int = 32, fire_threshold: float = 512.0,
                 ssmax_init: float = 1.0, ssmax_scope: str = "all", rms_norm_eps: float = 1e-5,
                 initializer_range: float = 0.02,
                 attn_backend: str = "auto", attn_chunk_size: int = 512, ffn_chunk_size: int | None = 32768,
                 max_position_embeddings: int = 512,
                 tie_word_embeddings: bool = True, use_cache: bool = True, pad_token_id: int | None = None,
                 bos_token_id: int | None = None, eos_token_id: int | None = None, **kwargs):
        get_scheme(pe)  # ValueError listing the known schemes
        if normaliser not in NORMALISERS:
            raise ValueError(f"unknown normaliser {normaliser!r}; known: {', '.join(NORMALISERS)}")
        if ssmax_scope not in SSMAX_SCOPES:
            raise ValueError(f"unknown ssmax_scope {ssmax_scope!r}; known: {', '.join(SSMAX_SCOPES)}")
        if ggd_init not in GGD_INITS:
            raise ValueError(f"unknown ggd_init {ggd_init!r}; known: {', '.join(GGD_INITS)}")
        if not float(fire_threshold) > 0:
            raise ValueError(f"fire_threshold must be > 0, got {fire_threshold}")
        for name, val in (("vocab_size", vocab_size), ("hidden_size", hidden_size), ("fire_hidden", fire_hidden),
                          ("num_hidden_layers", num_hidden_layers), ("num_attention_heads", num_attention_heads),
                          ("attn_chunk_size", attn_chunk_size)):
            if int(val) <= 0:
                raise ValueError(f"{name} must be positive, got {val}")
        if hidden_size % num_attention_heads:
            raise ValueError(f"hidden_size {hidden_size} is not divisible by num_attention_heads {num_attention_heads}")
        num_key_value_heads = num_key_value_heads or num_attention_heads
        if num_attention_heads % num_key_value_heads:
            raise ValueError(f"num_attention_heads {num_attention_heads} is not a multiple of "
                             f"num_key_value_heads {num_key_value_heads}")
        if pe == "rope" and (hidden_size // num_attention_heads) % 2:
            raise ValueError("pe='rope' needs an even head dimension")
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.intermediate_size = intermediate_size or 64 * ((8 * hidden_size // 3 + 63) // 64)
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.num_key_value_heads = num_key_value_heads
        self.head_dim = hidden_size // num_attention_heads
        self.pe = pe
        self.normaliser = normaliser
        self.rope_theta = rope_theta
        self.sinusoidal_base = sinusoidal_base
        # token embeddings x embed_scale before an absolute position embedding is added (None = 1:
        # the configs saved before this field existed); from_preset gives sinusoidal sqrt(d_model)
        if embed_scale is not None and not float(embed_scale) > 0:
            raise ValueError(f"embed_scale must be > 0, got {embed_scale}")
        self.embed_scale = None if embed_scale is None else float(embed_scale)
        # std of the token embeddings at initialisation (None = initializer_range, as every other weight)
        if embed_init_std is not None and not float(embed_init_std) > 0:
            raise ValueError(f"embed_init_std must be > 0, got {embed_init_std}")
        self.embed_init_std = None if embed_init_std is None else float(embed_init_std)
        self.ggd_init = ggd_init
        self.ggd_theta_alpha = ggd_theta_alpha
        self.ggd_theta_beta = ggd_theta_beta
        self.ggd_eps = ggd_eps
        self.ggd_share_layers = ggd_share_layers
        self.fire_hidden = int(fire_hidden)
        self.fire_threshold = float(fire_threshold)
        self.ssmax_init = ssmax_init
        self.ssmax_scope = ssmax_scope
        self.rms_norm_eps = rms_norm_eps
        self.initializer_range = initializer_range
        self.attn_backend = attn_backend
        self.attn_chunk_size = attn_chunk_size
        self.ffn_chunk_size = ffn_chunk_size
        self.max_position_embeddings = max_position_embeddings  # training context (informative only)
        # No position table: every scheme computes its positions on the fly, so any input length runs
        # (the evaluators read this flag instead of refusing inputs beyond max_position_embeddings).
        self.extrapolates = True
        self.use_cache = use_cache
        super().__init__(tie_word_embeddings=tie_word_embeddings, pad_token_id=pad_token_id,
                         bos_token_id=bos_token_id, eos_token_id=eos_token_id, **kwargs)

    @classmethod
    def defaults(cls) -> dict:
        """Every constructor argument with its default: the model settings a saved config records and
        ``--model-opt`` may set."""

        params = inspect.signature(cls.__init__).parameters.values()
        return {p.name: p.default for p in params if p.kind is p.POSITIONAL_OR_KEYWORD and p.name != "self"}

    @classmethod
    def from_preset(cls, preset: str, **overrides) -> "BamConfig":
        """A config of size ``preset`` (one of :data:`PRESETS`), with ``overrides`` applied.

        With ``pe="sinusoidal"`` the token embeddings start at std ``hidden_size ** -0.5`` and are scaled
        by ``sqrt(hidden_size)`` (Vaswani et al. 2017, sec. 3.4; the initialisation of fairseq's and
        tensor2tensor's Transformer), so content enters with unit variance beside the amplitude-1
        sinusoidal table. At the usual std ``initializer_range`` (0.02) the position would swamp the
        content at the input (x sqrt(d) alone, used up to 2026-12-04, gives 0.23 at d = 128).
        """
        if preset not in PRESETS:
            raise ValueError(f"unknown preset {preset!r}; known presets: {', '.join(PRESETS)}")
        kwargs = {**PRESETS[preset], **overrides}
        if kwargs.get("pe") == "sinusoidal":
            width = float(kwargs.get("hidden_size", 128))
            kwargs.setdefault("embed_scale", width ** 0.5)
            kwargs.setdefault("embed_init_std", width ** -0.5)
        return cls(**kwargs)
