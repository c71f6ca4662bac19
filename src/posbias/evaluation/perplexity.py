"""Perplexity of a causal LM over a token stream, in two modes.

``non-overlapping``
    The stream is cut into independent windows of ``context`` tokens (the last one may be
    shorter); every token but the first of each window is scored with only the tokens before it
    *in its window* as context. On average a scored token sees ``context / 2`` tokens, and the
    late tokens of each window see the whole window, so this is the figure that shows whether the
    model can actually run (and use its context) at this length.

``sliding``
    The standard Hugging Face recipe: windows of ``context`` tokens start every ``stride`` tokens
    (default ``context // 2``), and only the tokens a window adds beyond the previous window's end
    are scored, so every scored token (after the first window) sees at least
    ``context - stride`` tokens of context. This figure alone hides a model that only attends
    locally (it looks fine at any length), which is why the study reports both.

With ``stride == context`` both modes score exactly the same tokens with the same contexts.

With ``stride < context`` every token of the stream except the very first is scored exactly once
in ``sliding`` mode; in ``non-overlapping`` mode the first token of every window is not scored.

Only the logits of scored positions are materialised (``logits_to_keep`` where the model
supports it), and the loss is computed in float32.
"""
from __future__ import annotations

import inspect
import math
from typing import Literal

import torch

from posbias.architecture.layers import model_device
from posbias.utils.progress import progress_bar

Mode = Literal["non-overlapping", "sliding"]
_LOSS_CHUNK = 2048  # positions per float32 log-softmax slice


def _accepts_logits_to_keep(model) -> bool:
    try:
        params = inspect.signature(model.forward).parameters
    except (TypeError, ValueError):  # pragma: no cover
        return False
    return "logits_to_keep" in params or any(p.kind is p.VAR_KEYWORD for p in params.values())


def windows(n_tokens: int, *, context: int, mode: Mode = "non-overlapping",
            stride: int | None = None) -> list[tuple[int, int, int]]:
    """The windows a perplexity run evaluates, as ``(begin, end, n_scored)`` triples.

    The window is ``token_ids[begin:end]``; its last ``n_scored`` tokens are scored (each
    predicted from the tokens before it inside the window). ``n_scored <= end - begin - 1``.
    """
    if context < 2:
        raise ValueError(f"context must be >= 2 tokens, got {context}")
    if n_tokens < 2:
        raise ValueError(f"need at least 2 tokens to compute a perplexity, got {n_tokens}")
    out: list[tuple[int, int, int]] = []
    if mode == "non-overlapping":
        for begin in range(0, n_tokens, context):
            end = min(begin + context, n_tokens)
            if end - begin >= 2:
                out.append((begin, end, end - begin - 1))
        return out
    if mode != "sliding":
        raise ValueError(f"unknown perplexity mode {mode!r}: use 'non-overlapping' or 'sliding'")
    stride = context // 2 if stride is None else int(stride)
    if not (1 <= stride <= context):
        raise ValueError(f"stride must be in [1, context={context}], got {stride}")
    prev_end = 0
    for begin in range(0, n_tokens, stride):
        end = min(begin + context, n_tokens)
        n_new = end - prev_end
        # The first token of a window has no prediction inside the window.
        n_scored = min(n_new, end - begin - 1)
        if n_scored > 0:
            out.append((begin, end, n_scored))
        prev_end = end
        if end == n_tokens:
            break
    return out


@torch.no_grad()
def _window_nll(model, batch: torch.Tensor, n_scored: int, use_keep: bool) -> torch.Tensor:
    """Summed NLL (float64, one value per row) of the last ``n_scored`` tokens of each row."""
    kwargs = {"use_cache": False}
    if use_keep:
        # logits for the positions that predict the scored tokens: the n_scored positions just
        # before them; the last position's logits (predicting beyond the window) are dropped.
        kwargs["logits_to_keep"] = n_scored + 1
    logits = model(input_ids=batch, **kwargs).logits
    logits = logits[:, -(n_scored + 1):-1, :]
    targets = batch[:, -n_scored:]
    total = torch.zeros(batch.shape[0], dtype=torch.float64, device=logits.device)
    for s in range(0, n_scored, _LOSS_CHUNK):  # float32 log-softmax a slice at a time (memory)
        logp = torch.log_softmax(logits[:, s:s + _LOSS_CHUNK].float(), dim=-1)
        total -= logp.gather(-1, targets[:, s:s + _LOSS_CHUNK].unsqueeze(-1)).squeeze(-1).double().sum(-1)
    return total


@torch.no_grad()
def perplexity(model, token_ids, *, context: int, mode: Mode = "non-overlapping",
               stride: int | None = None, batch_size: int = 1, progress: bool = False) -> dict:
    """Perplexity of ``model`` on a 1-D stream of token ids.

    Args:
        model: any Hugging Face causal LM (``model(input_ids=...).logits``).
        token_ids: 1-D LongTensor (or sequence of ints) of length N >= 2.
        context: window length in tokens.
        mode: ``"non-overlapping"`` or ``"sliding"`` (see the module docstring).
        stride: sliding-window step (default ``context // 2``); ignored for non-overlapping.
        batch_size: windows of equal shape evaluated together.

    Returns:
        ``{"ppl", "nll", "tokens", "windows", "context", "mode", "stride"}`` where ``nll`` is the
        mean negative log-likelihood per scored token (nats) and ``ppl = exp(nll)``.
    """
    ids = torch.as_tensor(token_ids, dtype=torch.long).reshape(-1)
    wins = windows(ids.numel(), context=context, mode=mode, stride=stride)
    device = model_device(model)
    use_keep = _accepts_logits_to_keep(model)
    was_training = model.training
    model.eval()
    total = 0.0
    count = 0
    # Group windows of identical (length, n_scored) so they can be batched.
    groups: dict[tuple[int, int], list[int]] = {}
    for begin, end, n_scored in wins:
        groups.setdefault((end - begin, n_scored), []).append(begin)
    bar = None
    if progress:
        bar = progress_bar(len(wins), desc=f"ppl {mode} @{context}", leave=False)
    try:
        for (length, n_scored), begins in groups.items():
            for i in range(0, len(begins), max(1, batch_size)):
                chunk = begins[i:i + max(1, batch_size)]
                batch = torch.stack([ids[b:b + length] for b in chunk]).to(device)
                total += float(_window_nll(model, batch, n_scored, use_keep).sum())
                count += n_scored * len(chunk)
                if bar is not None:
                    bar.update(len(chunk))
    finally:
        if bar is not None:
            bar.close()
        if was_training:
            model.train()
    nll = total / count
    return {
        "ppl": math.exp(nll) if nll < 700 else float("inf"),
        "nll": nll,
        "tokens": count,
        "windows": len(wins),
        "context": context,
        "mode": mode,
        "stride": (context // 2 if stride is None else stride) if mode == "sliding" else None,
    }
