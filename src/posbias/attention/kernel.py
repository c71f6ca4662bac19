"""One attention entry point, :func:`attend`, with three interchangeable backends.

Logits follow the BAM order (Bianchessi et al. 2025)::

    z = q k^T / sqrt(d) + bias[h, i, j]          # positional prior (ALiBi / GGD / KERPLE / FIRE), optional
    z = z * (s_h * log n_i)                       # SSMax (Nakanishi 2025), optional
    z = mask(z)                                   # causal, same document, key padding
    out = softmax_float32(z) @ v

Backends:

* ``"sdpa"``    - ``torch.nn.functional.scaled_dot_product_attention`` with an additive float
  mask (SSMax folded in exactly: ``q' = q * c``, ``mask = bias * c``). Builds the full
  [b, h, i, j] mask: training lengths. Works on CPU with backward.
* ``"chunked"`` - exact, queries in chunks of ``chunk_size`` against all keys; the bias and mask
  are built per chunk, so memory grows linearly with length. Float32 throughout.
* ``"flex"``    - FlexAttention ``score_mod`` + block mask, CUDA only (optional; needs the bias
  module to expose ``score_fn()``: ``f(head, q_pos - k_pos, q_pos)``, the query position for FIRE).
* ``"eager"``   - the chunked path with one chunk (reference implementation).

``"auto"`` picks ``chunked`` when ``q_len * k_len`` exceeds ``CHUNK_THRESHOLD`` (or a
``chunk_size`` is given), else ``sdpa``.

Positions: queries are the *last* ``q_len`` of the ``k_len`` keys (KV cache friendly), so query
``i`` sits at position ``k_len - q_len + i``.
"""
from __future__ import annotations

import math
from typing import Callable

import torch
import torch.nn.functional as F

from posbias.utils.memory import keep_freed_memory

CHUNK_THRESHOLD = 4096 * 4096  # q_len * k_len above which "auto" switches to the chunked path
DEFAULT_CHUNK = 512
BLOCK_BYTES = 32 << 20  # largest float32 logits block per chunk (glibc's mmap ceiling: heap-reused below it)
MIN_ROWS = 16
BACKENDS = ("auto", "sdpa", "chunked", "eager", "flex")
_NEG = torch.finfo(torch.float32).min  # masked logits of the float32 paths (replaced, never added to)
_MASK_ADD = -1e30  # additive SDPA mask: finite in bf16 too, far below any prior (|bias| <= ~1e26 x s log n)

BiasFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def _allowed(q_pos, k_pos, q_doc, k_doc, key_mask, causal: bool):
    """Boolean mask [b|1, 1, i, j] of allowed (query, key) pairs, or None when all are allowed."""
    m = None
    if causal:
        m = (k_pos[None, :] <= q_pos[:, None])[None, None]
    if q_doc is not None:
        d = (q_doc[:, :, None] == k_doc[:, None, :])[:, None]
        m = d if m is None else (m & d)
    if key_mask is not None:
        km = key_mask.bool()[:, None, None, :]
        m = km if m is None else (m & km)
    return m


def visible_keys(q_len: int, k_len: int, *, doc_ids=None, key_mask=None, causal=True, device=None,
                 chunk_size: int = DEFAULT_CHUNK) -> torch.Tensor:
    """Number of keys each query may attend to: Long [b|1, q_len] (the ``n_i`` of SSMax)."""
    device = device if device is not None else (doc_ids.device if doc_ids is not None else None)
    q_pos = torch.arange(k_len - q_len, k_len, device=device)
    k_pos = torch.arange(k_len, device=device)
    q_doc = doc_ids[:, k_len - q_len:] if doc_ids is not None else None
    if q_doc is None and key_mask is None:
        n = (q_pos + 1) if causal else torch.full((q_len,), k_len, device=device)
        return n[None]
    out = []
    for s in range(0, q_len, chunk_size):
        e = min(q_len, s + chunk_size)
        m = _allowed(q_pos[s:e], k_pos, None if q_doc is None else q_doc[:, s:e], doc_ids, key_mask, causal)
        out.append(m.sum(-1)[:, 0])
    return torch.cat(out, dim=-1)


def _bias(bias, q_pos, k_pos, q0: int, descending_queries: bool = False, q_index=None):
    """[1|b, h, i, j] bias. Here queries are ``q0 + arange(i)`` (reversed with ``descending_queries``) and
    keys ``arange(j)`` (contiguous), so the Toeplitz ``bias.block`` is used when the module offers it
    (no device sync: ``q0`` is a host int). A query-dependent prior (FIRE, ``query_dependent``) also
    gets ``q_index`` (Long [b|1, i], the queries' own positions) and may differ per batch row."""
    if getattr(bias, "query_dependent", False):
        out = bias(q_pos, k_pos, q_index)
        return out if out.dim() == 4 else out[None]
    if _has_toeplitz_block(bias):
        return bias.block(q0, len(q_pos), 0, len(k_pos), device=q_pos.device,
                          descending_queries=descending_queries)[None]
    return bias(q_pos, k_pos)[None]


def _has_toeplitz_block(bias) -> bool:
    return getattr(bias, "block", None) is not None


def _expand_kv(k, v, n_heads):
    if k.shape[1] != n_heads:
        if n_heads % k.shape[1]:
            raise ValueError(f"{n_heads} query heads cannot share {k.shape[1]} key/value heads")
        rep = n_heads // k.shape[1]
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    return k, v


def _content_only(normaliser) -> bool:
    """SSMax scaling the content logits only (the prior added after it; ``SSMax.scope``)."""
    return normaliser is not None and getattr(normaliser, "scope", "all") == "content"


def _block(q, k, v, q_pos, k_pos, q_doc, k_doc, key_mask, bias, normaliser, causal, q0, return_probs=False,
           q_index=None):
    """Exact float32 attention of a query block against all keys. q: [b, h, i, d] -> [b, h, i, d]
    (and the float32 probabilities [b, h, i, j] with ``return_probs``).

    The [b, h, i, j] logits are updated in place wherever autograd allows it (one such block is
    allocated per step instead of one per operation: at long contexts the copies, not the
    arithmetic, dominated the time). With a Toeplitz prior (``bias.block``) the query rows are
    processed last-first, which makes the prior a view of its ``i + j - 1`` offsets instead of an
    [h, i, j] copy (flip + add were a third of the time at 16K tokens); outputs are returned in the
    given order."""
    descending = bias is not None and _has_toeplitz_block(bias) and not getattr(bias, "query_dependent", False)
    if descending:
        q, q_pos, q_doc = q.flip(2), q_pos.flip(0), None if q_doc is None else q_doc.flip(-1)
    scale = 1.0 / math.sqrt(q.shape[-1])
    z = torch.matmul(q.float(), k.float().transpose(-1, -2)).mul_(scale)  # [b, h, i, j]
    prior = _bias(bias, q_pos, k_pos, q0, descending, q_index) if bias is not None else None
    content_only = _content_only(normaliser)
    if prior is not None and not content_only:
        z.add_(prior)
    # plain causal: keys [0, seen) precede every query of the block and are never masked, so only
    # the keys from ``seen`` on are compared and filled (queries sit at q0 .. q0 + i - 1)
    seen = q0 + 1 if causal and q_doc is None and key_mask is None else 0
    allowed = _allowed(q_pos, k_pos[seen:], q_doc, None if k_doc is None else k_doc[:, seen:],
                       None if key_mask is None else key_mask[:, seen:], causal)
    if normaliser is not None:
        if allowed is None:
            n = torch.full((1, q.shape[2]), k.shape[2], device=q.device)
        else:
            n = seen + allowed.sum(-1)[:, 0]
        multiplier = normaliser.multiplier(n)
        # the multiplier's gradient needs the logits before scaling: out of place when it is tracked
        z = z * multiplier if multiplier.requires_grad and torch.is_grad_enabled() else z.mul_(multiplier)
    if prior is not None and content_only:
        z.add_(prior)
    if allowed is not None:
        z[..., seen:].masked_fill_(~allowed, _NEG)
    p = torch.softmax(z, dim=-1)
    out = torch.matmul(p, v.float()).to(q.dtype)
    if descending:
        out, p = out.flip(2), (p.flip(2) if return_probs else p)
    return (out, p) if return_probs else out


def _sdpa(q, k, v, q_pos, k_pos, q_doc, k_doc, key_mask, bias, normaliser, causal, q0, q_index=None):
    nq, nk = q.shape[2], k.shape[2]
    if bias is None and normaliser is None and q_doc is None and key_mask is None:
        if not causal:
            return F.scaled_dot_product_attention(q, k, v)
        if nq == nk:
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    allowed = _allowed(q_pos, k_pos, q_doc, k_doc, key_mask, causal)
    add = _bias(bias, q_pos, k_pos, q0, q_index=q_index) if bias is not None else None  # [1|b, h, i, j] float32
    if normaliser is not None:
        if allowed is None:
            n = torch.full((1, nq), nk, device=q.device)
        else:
            n = allowed.sum(-1)[:, 0]
        c = normaliser.multiplier(n)  # [b, h, i, 1]
        q = (q.float() * c).to(q.dtype)
        if add is not None and not _content_only(normaliser):
            add = add * c
    if add is None:
        if allowed is None:
            return F.scaled_dot_product_attention(q, k, v)
        mask = torch.where(allowed, 0.0, _MASK_ADD)
    else:
        mask = add if allowed is None else torch.where(allowed, add, torch.tensor(_MASK_ADD, device=q.device))
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask.to(q.dtype))


def _flex(q, k, v, q_pos, k_pos, q_doc, k_doc, key_mask, bias, normaliser, causal, q0=None,
          q_index=None):  # pragma: no cover (CUDA)
    # FlexAttention ships with torch >= 2.5 (pyproject allows 2.4), and only CUDA runs use it
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention  # noqa: PLC0415 (optional)


    b, h, nq, _ = q.shape
    nk = k.shape[2]
    offset = nk - nq
    bias_f = bias.score_fn(q.device) if getattr(bias, "score_fn", None) is not None else None
    if bias is not None and bias_f is None:
        raise ValueError("backend='flex' needs a bias module with score_fn()")
    mult = None
    if normaliser is not None:
        n = visible_keys(nq, nk, doc_ids=k_doc, key_mask=key_mask, causal=causal, device=q.device)
        mult = normaliser.multiplier(n.expand(b, nq))[..., 0].contiguous()  # [b, h, i]

    content_only = _content_only(normaliser)
    # the queries' own positions (FIRE's i): [b|1, i]; rows broadcast when there is one
    q_at = (q_pos[None] if q_index is None else q_index).expand(b, nq).contiguous()

    def score_mod(score, bi, hi, qi, ki):
        z = score.float()
        if bias_f is not None and not content_only:
            z = z + bias_f(hi, (qi + offset - ki).float(), q_at[bi, qi])
        if mult is not None:
            z = z * mult[bi, hi, qi]
        if bias_f is not None and content_only:
            z = z + bias_f(hi, (qi + offset - ki).float(), q_at[bi, qi])
        return z.to(score.dtype)

    def mask_mod(bi, hi, qi, ki):
        ok = (ki <= qi + offset) if causal else (ki >= 0)
        if q_doc is not None:
            ok = ok & (k_doc[bi, ki] == q_doc[bi, qi])
        if key_mask is not None:
            ok = ok & key_mask[bi, ki].bool()
        return ok

    need_batch = q_doc is not None or key_mask is not None
    bm = create_block_mask(mask_mod, b if need_batch else None, None, nq, nk, device=q.device)
    fn = _compiled_flex(flex_attention)
    return fn(q, k, v, score_mod=score_mod, block_mask=bm, enable_gqa=k.shape[1] != h)


_FLEX_CACHE: dict = {}


def _compiled_flex(fn):  # pragma: no cover (CUDA)
    if "f" not in _FLEX_CACHE:
        _FLEX_CACHE["f"] = torch.compile(fn, dynamic=False)
    return _FLEX_CACHE["f"]


def flex_available(device: torch.device | str) -> bool:
    """True when FlexAttention can run here (CUDA device and a torch that ships it)."""
    if torch.device(device).type != "cuda":
        return False
    try:
        from torch.nn.attention import flex_attention  # noqa: F401, PLC0415 (probes whether this torch ships it)
    except ImportError:
        return False
    return True


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, bias: BiasFn | None = None,
           doc_ids: torch.Tensor | None = None, normaliser=None, causal: bool = True,
           chunk_size: int | None = None, backend: str = "auto",
           key_mask: torch.Tensor | None = None, return_probs: bool = False,
           query_positions: torch.Tensor | None = None):
    """Attention with an optional positional prior, SSMax and packed-document masking.

    Args:
        q: [b, h, i, d] queries (the last ``i`` positions of the key sequence).
        k, v: [b, h_kv, j, d] keys / values; ``h`` must be a multiple of ``h_kv`` (GQA).
        bias: callable ``bias(q_pos: Long[i'], k_pos: Long[j]) -> float [h, i', j]`` (e.g.
            :class:`~posbias.positional.GGDBias`), called per query chunk (its Toeplitz ``block`` when
            it has one, a view of the block's offsets).
        doc_ids: [b, j] document id of every key (queries take the last ``i``); attention and
            SSMax counts never cross documents.
        normaliser: ``None`` (softmax) or an :class:`~posbias.attention.SSMax` module.
        causal: mask keys after the query.
        chunk_size: query chunk length for the chunked path (forces it when given with "auto").
        backend: one of :data:`BACKENDS`.
        key_mask: [b, j] 1/True for real keys, 0/False for padding.
        return_probs: also return the attention probabilities (float32 [b, h, i, j], prior, SSMax
            and masks included), computed on the exact eager path whatever ``backend`` says.
        query_positions: Long [b|1, i], each query's position as a query-dependent prior reads it
            (FIRE's ``i``; :class:`~posbias.bam.BamModel` passes positions that restart at every document
            and skip left padding); default its index in the key sequence. Distance-only priors ignore it.

    Returns: [b, h, i, d] in the dtype of ``q`` (with ``return_probs``: ``(out, probs)``).
    """
    if backend not in BACKENDS:
        raise ValueError(f"unknown attention backend {backend!r}; known: {', '.join(BACKENDS)}")
    h, nq, nk = _check_shapes(q, k, v, doc_ids, key_mask)
    if query_positions is not None and (query_positions.dim() != 2 or query_positions.shape[-1] != nq):
        raise ValueError(f"query_positions must be [batch, {nq}], got {tuple(query_positions.shape)}")
    q_pos = torch.arange(nk - nq, nk, device=q.device)
    q_index = q_pos[None] if query_positions is None else query_positions.to(q.device)
    k_pos = torch.arange(nk, device=q.device)
    doc_ids = None if doc_ids is None else doc_ids.to(q.device)
    q_doc = None if doc_ids is None else doc_ids[:, nk - nq:]
    args = (q_pos, k_pos, q_doc, doc_ids, key_mask, bias, normaliser, causal, nk - nq)
    if return_probs:
        k, v = _expand_kv(k, v, h)
        return _block(q, k, v, *args, return_probs=True, q_index=q_index)
    if backend == "auto":
        backend = "chunked" if (chunk_size is not None or nq * nk > CHUNK_THRESHOLD) else "sdpa"
    if backend == "flex":
        if not flex_available(q.device):
            raise RuntimeError("backend='flex' needs a CUDA device and torch.nn.attention.flex_attention")
        return _flex(q, k, v, *args, q_index=q_index)
    k, v = _expand_kv(k, v, h)
    if backend == "sdpa":
        return _sdpa(q, k, v, *args, q_index=q_index)
    if backend == "eager":
        return _block(q, k, v, *args, q_index=q_index)
    return _chunked(q, k, v, *args, chunk_size=chunk_size or DEFAULT_CHUNK, q_index=q_index)


def _check_shapes(q, k, v, doc_ids, key_mask) -> tuple[int, int, int]:
    """``(query heads, queries, keys)`` after checking the shapes :func:`attend` documents."""
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError("q, k, v must be [batch, heads, length, head_dim]")
    h, nq, nk = q.shape[1], q.shape[2], k.shape[2]
    if nq > nk:
        raise ValueError(f"more queries ({nq}) than keys ({nk})")
    for name, t in (("doc_ids", doc_ids), ("key_mask", key_mask)):
        if t is not None and t.shape[-1] != nk:
            raise ValueError(f"{name} has length {t.shape[-1]}, expected the key length {nk}")
    return h, nq, nk


def _rows_per_chunk(chunk_size: int, cells_per_row: int) -> int:
    """Query rows per chunk: at most ``chunk_size``, fewer when one float32 [b, h, rows, j] block
    would exceed ``BLOCK_BYTES`` (``cells_per_row`` = b * h * j), never fewer than ``MIN_ROWS``."""
    return max(min(chunk_size, MIN_ROWS), min(chunk_size, BLOCK_BYTES // (4 * max(1, cells_per_row))))


def _chunked(q, k, v, q_pos, k_pos, q_doc, doc_ids, key_mask, bias, normaliser, causal, offset, *,
             chunk_size: int, q_index=None) -> torch.Tensor:
    """Exact attention one query chunk at a time (memory ~ chunk x keys); k, v already expanded."""
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be positive, got {chunk_size}")
    keep_freed_memory()
    nq, nk = q.shape[2], k.shape[2]
    chunk_size = _rows_per_chunk(chunk_size, q.shape[0] * q.shape[1] * nk)
    # one output tensor, written chunk by chunk: results kept in a list would sit between the freed
    # blocks on the heap and keep them from merging, so every (larger) next block took fresh memory
    # and the peak grew with the square of the length (2 GB at 16K tokens for a 4-head model).
    out = None if torch.is_grad_enabled() and q.requires_grad else q.new_empty(q.shape)
    outs = []
    for s in range(0, nq, chunk_size):
        e = min(nq, s + chunk_size)
        # causal: keys after the chunk's last query are masked for every query of the chunk, and
        # contribute exactly 0 after the softmax, so they are skipped (about half the work).
        j = (offset + e) if causal else nk
        block = _block(q[:, :, s:e], k[:, :, :j], v[:, :, :j], q_pos[s:e], k_pos[:j],
                       None if q_doc is None else q_doc[:, s:e], None if doc_ids is None else doc_ids[:, :j],
                       None if key_mask is None else key_mask[:, :j], bias, normaliser, causal, offset + s,
                       q_index=None if q_index is None else q_index[:, s:e])
        if out is None:
            outs.append(block)
        else:
            out[:, :, s:e] = block
    return torch.cat(outs, dim=2) if out is None else out
