"""posbias.evaluation.perplexity: windows, token counts, and a hand-computed case."""
from __future__ import annotations

import math

import pytest
import torch
from conftest import make_tiny_model

from posbias.evaluation.perplexity import perplexity, windows


class _Out:
    def __init__(self, logits):
        self.logits = logits


class BigramLM(torch.nn.Module):
    """A toy causal LM whose next-token distribution depends only on the current token:
    logits[t] = table[token_t]. Its perplexity can be computed by hand."""

    def __init__(self, table: torch.Tensor):
        super().__init__()
        self.table = torch.nn.Parameter(table.clone())
        self.calls: list[tuple[int, ...]] = []

    def forward(self, input_ids, logits_to_keep: int = 0, **kw):
        self.calls.append(tuple(input_ids.shape))
        logits = self.table[input_ids]
        if logits_to_keep:
            logits = logits[:, -logits_to_keep:]
        return _Out(logits)


class FirstTokenLM(BigramLM):
    """Prediction depends on the first token of the window: a model that uses context."""

    def forward(self, input_ids, logits_to_keep: int = 0, **kw):
        logits = self.table[input_ids[:, :1]].expand(-1, input_ids.shape[1], -1)
        if logits_to_keep:
            logits = logits[:, -logits_to_keep:]
        return _Out(logits)


def test_windows_non_overlapping_counts():
    w = windows(10, context=4, mode="non-overlapping")
    assert w == [(0, 4, 3), (4, 8, 3), (8, 10, 1)]
    # a last window of one token scores nothing and is dropped
    assert windows(9, context=4, mode="non-overlapping") == [(0, 4, 3), (4, 8, 3)]


def test_windows_sliding_scores_every_token_once():
    for n, c, s in [(10, 4, 2), (17, 8, 3), (9, 4, 1), (8, 8, 4), (5, 8, 4)]:
        w = windows(n, context=c, mode="sliding", stride=s)
        scored = []
        for begin, end, k in w:
            assert end - begin <= c and k <= end - begin - 1
            scored.extend(range(end - k, end))
        assert scored == list(range(1, n)), (n, c, s, w)
    assert windows(10, context=4, mode="sliding") == windows(10, context=4, mode="sliding", stride=2)


def test_windows_bad_arguments():
    with pytest.raises(ValueError, match="stride"):
        windows(10, context=4, mode="sliding", stride=5)
    with pytest.raises(ValueError, match="mode"):
        windows(10, context=4, mode="strided")
    with pytest.raises(ValueError, match="2 tokens"):
        windows(1, context=4)


def test_hand_computed_bigram():
    # vocab 2: after token 0 p(0)=0.75, p(1)=0.25; after token 1 p(0)=p(1)=0.5
    table = torch.log(torch.tensor([[0.75, 0.25], [0.5, 0.5]]))
    model = BigramLM(table)
    ids = torch.tensor([0, 0, 1, 1, 0])
    # non-overlapping, context 3: windows [0,0,1] -> p(0|0) p(1|0); [1,0] -> p(0|1)
    r = perplexity(model, ids, context=3, mode="non-overlapping")
    expected = -(math.log(0.75) + math.log(0.25) + math.log(0.5)) / 3
    assert r["tokens"] == 3 and r["windows"] == 2
    assert r["nll"] == pytest.approx(expected, abs=1e-6)
    assert r["ppl"] == pytest.approx(math.exp(expected), rel=1e-6)
    # sliding scores all 4 transitions
    r = perplexity(model, ids, context=3, mode="sliding", stride=1)
    expected = -(math.log(0.75) + math.log(0.25) + math.log(0.5) + math.log(0.5)) / 4
    assert r["tokens"] == 4
    assert r["nll"] == pytest.approx(expected, abs=1e-6)


def test_context_dependent_model_separates_modes():
    # prediction from the first token of the window: p(x | window starts with 0) = [0.9, 0.1]
    table = torch.log(torch.tensor([[0.9, 0.1], [0.1, 0.9]]))
    model = FirstTokenLM(table)
    ids = torch.tensor([0, 0, 0, 1, 1, 1])
    r = perplexity(model, ids, context=3, mode="non-overlapping")
    # windows [0,0,0] (2 x 0.9) and [1,1,1] (2 x 0.9)
    assert r["nll"] == pytest.approx(-math.log(0.9), abs=1e-6)
    r = perplexity(model, ids, context=3, mode="sliding", stride=1)
    # [0,0,0]: 0,0 from 0 -> .9,.9; [0,0,1]: 1 from first 0 -> .1; [0,1,1]: .1; [1,1,1]: .9
    exp = -(3 * math.log(0.9) + 2 * math.log(0.1)) / 5
    assert r["tokens"] == 5 and r["nll"] == pytest.approx(exp, abs=1e-6)


def test_sliding_with_stride_equal_context_matches_non_overlapping():
    model = make_tiny_model("llama", layers=2, hidden=32)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, 512, (70,), generator=g)
    a = perplexity(model, ids, context=16, mode="non-overlapping", batch_size=3)
    b = perplexity(model, ids, context=16, mode="sliding", stride=16)
    assert a["tokens"] == b["tokens"] == 4 * 15 + 5
    assert a["nll"] == pytest.approx(b["nll"], rel=1e-5)


def test_batching_and_logits_to_keep_do_not_change_result():
    model = make_tiny_model("llama", layers=2, hidden=32)
    ids = torch.randint(3, 512, (64,), generator=torch.Generator().manual_seed(1))
    a = perplexity(model, ids, context=16, mode="sliding", stride=4, batch_size=1)
    b = perplexity(model, ids, context=16, mode="sliding", stride=4, batch_size=8)
    assert a["tokens"] == b["tokens"] == 63
    assert a["nll"] == pytest.approx(b["nll"], rel=1e-5)
    # reference: the full-logits HF loss over one window equals our single-window figure
    with torch.no_grad():
        ref = model(input_ids=ids[None, :16], labels=ids[None, :16]).loss.item()
    c = perplexity(model, ids[:16], context=16)
    assert c["nll"] == pytest.approx(ref, rel=1e-5)


def test_loss_slicing_does_not_change_result(monkeypatch):
    import posbias.evaluation.perplexity as P

    model = make_tiny_model("llama", layers=1, hidden=32)
    ids = torch.randint(3, 512, (40,), generator=torch.Generator().manual_seed(2))
    a = perplexity(model, ids, context=20, mode="sliding", stride=7)
    monkeypatch.setattr(P, "_LOSS_CHUNK", 3)
    b = perplexity(model, ids, context=20, mode="sliding", stride=7)
    assert a["tokens"] == b["tokens"] == 39 and a["nll"] == pytest.approx(b["nll"], rel=1e-6)
