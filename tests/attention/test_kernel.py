import math

import pytest
import torch

from posbias.attention import SSMax, attend, visible_keys
from posbias.positional import GGDBias


def _qkv(b=2, h=4, n=40, d=8, hkv=None, seed=0):
    g = torch.Generator().manual_seed(seed)
    hkv = hkv or h
    return (torch.randn(b, h, n, d, generator=g), torch.randn(b, hkv, n, d, generator=g),
            torch.randn(b, hkv, n, d, generator=g))


def _docs(b=2, n=40):
    d = torch.zeros(b, n, dtype=torch.long)
    d[0, 13:] = 1
    d[0, 30:] = 2
    d[1, 25:] = 1
    return d


def _reference(q, k, v, bias, docs, ssmax, content_only=False):
    """Naive per-(b, h, i) loop following the BAM order literally (``content_only``: SSMax on q.k only)."""
    b, h, n, d = q.shape
    out = torch.zeros_like(q)
    pos = torch.arange(n)
    B = bias(pos, pos) if bias is not None else torch.zeros(h, n, n)
    for bi in range(b):
        for hi in range(h):
            for i in range(n):
                keys = [j for j in range(i + 1) if docs is None or docs[bi, j] == docs[bi, i]]
                c = torch.stack([q[bi, hi, i] @ k[bi, hi, j] / math.sqrt(d) for j in keys])
                prior = torch.stack([B[hi, i, j] for j in keys])
                scale = ssmax.s[hi] * math.log(len(keys)) if ssmax is not None else 1.0
                z = c * scale + prior if content_only else (c + prior) * scale
                p = torch.softmax(z, 0)
                out[bi, hi, i] = sum(p[t] * v[bi, hi, j] for t, j in enumerate(keys))
    return out


def test_sdpa_matches_naive_reference():
    q, k, v = _qkv(n=12, h=2)
    g = GGDBias(2, theta_alpha=[-1.0, 0.2], theta_beta=[0.7, -0.5])
    s = SSMax(2)
    with torch.no_grad():
        s.s.copy_(torch.tensor([0.8, 1.3]))
        docs = _docs(n=12)
        docs[0] = torch.tensor([0] * 5 + [1] * 7)
        ref = _reference(q, k, v, g, docs, s)
        for backend in ("sdpa", "eager", "chunked"):
            out = attend(q, k, v, bias=g, doc_ids=docs, normaliser=s, backend=backend, chunk_size=5)
            assert torch.allclose(out, ref, atol=1e-5), backend


def test_ssmax_on_the_content_only_matches_its_naive_reference():
    """The SSMax ablation: (q k / sqrt(d)) * s log n + prior, every backend, and differs from BAM's order."""
    q, k, v = _qkv(n=12, h=2)
    g = GGDBias(2, theta_alpha=[-1.0, 0.2], theta_beta=[0.7, -0.5])
    s = SSMax(2, scope="content")
    with torch.no_grad():
        s.s.copy_(torch.tensor([0.8, 1.3]))
        docs = _docs(n=12)
        ref = _reference(q, k, v, g, docs, s, content_only=True)
        for backend in ("sdpa", "eager", "chunked"):
            out = attend(q, k, v, bias=g, doc_ids=docs, normaliser=s, backend=backend, chunk_size=5)
            assert torch.allclose(out, ref, atol=1e-5), backend
        s.scope = "all"
        assert not torch.allclose(attend(q, k, v, bias=g, doc_ids=docs, normaliser=s), ref, atol=1e-3)
        # without a prior the two scopes are the same function
        s2 = SSMax(2, scope="content")
        s2.s.copy_(s.s)
        assert torch.equal(attend(q, k, v, doc_ids=docs, normaliser=s2, backend="eager"),
                           attend(q, k, v, doc_ids=docs, normaliser=s, backend="eager"))
    with pytest.raises(ValueError, match="unknown SSMax scope"):
        SSMax(2, scope="prior")


@pytest.mark.parametrize("use_bias,use_ssmax,use_docs", [(True, True, True), (True, False, False),
                                                         (False, True, False), (False, False, True)])
def test_chunked_equals_full(use_bias, use_ssmax, use_docs):
    q, k, v = _qkv()
    bias = GGDBias(4, theta_alpha=[-2.0, -1.0, 0.0, 0.5], theta_beta=[-1.0, 0.0, 1.0, 2.0]) if use_bias else None
    norm = SSMax(4) if use_ssmax else None
    docs = _docs() if use_docs else None
    full = attend(q, k, v, bias=bias, normaliser=norm, doc_ids=docs, backend="sdpa")
    for cs in (1, 7, 16, 64):
        ch = attend(q, k, v, bias=bias, normaliser=norm, doc_ids=docs, chunk_size=cs)
        assert torch.allclose(full, ch, atol=1e-5), cs


def test_chunked_equals_full_with_key_padding():
    q, k, v = _qkv()
    km = torch.ones(2, 40, dtype=torch.bool)
    km[1, :5] = False  # left padding of sample 1
    g, s = GGDBias(4, "linear"), SSMax(4)
    full = attend(q, k, v, bias=g, normaliser=s, key_mask=km, backend="sdpa")
    ch = attend(q, k, v, bias=g, normaliser=s, key_mask=km, chunk_size=8)
    assert torch.allclose(full[0], ch[0], atol=1e-5) and torch.allclose(full[1, :, 5:], ch[1, :, 5:], atol=1e-5)


def test_query_offset_kv_cache():
    """Queries that are the last positions of the keys (decode with a KV cache) equal the full rows."""
    q, k, v = _qkv()
    g = GGDBias(4, "linear")
    s = SSMax(4)
    full = attend(q, k, v, bias=g, normaliser=s)
    for backend in ("sdpa", "chunked"):
        last = attend(q[:, :, -3:], k, v, bias=g, normaliser=s, backend=backend, chunk_size=2)
        assert torch.allclose(last, full[:, :, -3:], atol=1e-5)


def test_gradients_reach_prior_and_ssmax():
    q, k, v = _qkv(n=16)
    q.requires_grad_(True)
    g = GGDBias(4, theta_alpha=0.1, theta_beta=[-1.0, 0.0, 1.0, 2.0])
    s = SSMax(4)
    for backend in ("sdpa", "chunked"):
        g.zero_grad(), s.zero_grad()
        attend(q, k, v, bias=g, normaliser=s, doc_ids=_docs(n=16), backend=backend,
               chunk_size=5).pow(2).sum().backward()
        for p in (g.theta_alpha, g.theta_beta, s.s):
            assert p.grad is not None and torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0, backend


@pytest.mark.parametrize("scope", ["all", "content"])
def test_chunked_gradients_equal_sdpa(scope):
    """The chunked path updates its logits in place where autograd allows: its gradients (q, k, v,
    GGD alpha / beta, SSMax s) equal those of the out-of-place SDPA path."""
    grads = {}
    for backend in ("sdpa", "chunked"):
        q, k, v = (t.clone().requires_grad_(True) for t in _qkv(n=24))
        g = GGDBias(4, theta_alpha=0.1, theta_beta=[-1.0, 0.0, 1.0, 2.0])
        s = SSMax(4, scope=scope)
        attend(q, k, v, bias=g, normaliser=s, doc_ids=_docs(n=24), backend=backend,
               chunk_size=5).pow(2).sum().backward()
        grads[backend] = [t.grad for t in (q, k, v, g.theta_alpha, g.theta_beta, s.s)]
    for a, b in zip(grads["sdpa"], grads["chunked"]):
        assert torch.allclose(a, b, atol=1e-4, rtol=1e-4)


def test_chunk_rows_shrink_to_the_block_budget(monkeypatch):
    """Long keys get fewer query rows per chunk (one float32 logits block <= BLOCK_BYTES), same result."""
    import posbias.attention.kernel as kernel

    assert kernel._rows_per_chunk(512, 4 * 16384) == 128  # b=1, h=4, 16K keys: 32 MB blocks
    assert kernel._rows_per_chunk(512, 1) == 512 and kernel._rows_per_chunk(4, 10 ** 9) == 4
    assert kernel._rows_per_chunk(512, 10 ** 9) == kernel.MIN_ROWS
    q, k, v = _qkv()
    g, s = GGDBias(4, "linear"), SSMax(4)
    full = attend(q, k, v, bias=g, normaliser=s, backend="eager")
    monkeypatch.setattr(kernel, "BLOCK_BYTES", 4 * 2 * 4 * 40 * 3)  # 3 rows of [b=2, h=4, j=40]
    monkeypatch.setattr(kernel, "MIN_ROWS", 1)
    rows = []
    block = kernel._block
    monkeypatch.setattr(kernel, "_block", lambda q, *a, **kw: rows.append(q.shape[2]) or block(q, *a, **kw))
    ch = attend(q, k, v, bias=g, normaliser=s, chunk_size=16)
    assert max(rows) == 3 and torch.allclose(full, ch, atol=1e-5)


def test_no_cross_document_attention():
    q, k, v = _qkv()
    docs = _docs()
    g, s = GGDBias(4, "alibi"), SSMax(4)
    out = attend(q, k, v, bias=g, normaliser=s, doc_ids=docs)
    v2 = v.clone()
    v2[0, :, :13] += 100.0  # change document 0 of sample 0 only
    k2 = k.clone()
    k2[0, :, :13] -= 5.0
    out2 = attend(q, k2, v2, bias=g, normaliser=s, doc_ids=docs)
    assert torch.allclose(out[0, :, 13:], out2[0, :, 13:], atol=1e-6)
    assert not torch.allclose(out[0, :, :13], out2[0, :, :13])
    assert torch.allclose(out[1], out2[1])


def test_visible_keys_counts():
    docs = _docs()
    n = visible_keys(40, 40, doc_ids=docs)
    assert n[0, 0].item() == 1 and n[0, 12].item() == 13 and n[0, 13].item() == 1 and n[0, 39].item() == 10
    assert visible_keys(3, 10).tolist() == [[8, 9, 10]]


def test_gqa_and_bad_inputs():
    q, k, v = _qkv(h=4, hkv=2)
    out = attend(q, k, v)
    ref = attend(q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1), backend="eager")
    assert torch.allclose(out, ref, atol=1e-5)
    with pytest.raises(ValueError, match="unknown attention backend"):
        attend(q, k, v, backend="magic")
    with pytest.raises(ValueError, match="doc_ids has length"):
        attend(q, k, v, doc_ids=torch.zeros(2, 3, dtype=torch.long))


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
def test_flex_score_mod_semantics_on_cpu(monkeypatch):
    """The FlexAttention path is CUDA-only in attend(); its score_mod / mask_mod are checked here with
    the uncompiled (CPU, forward-only) flex_attention against the eager path."""
    fa = pytest.importorskip("torch.nn.attention.flex_attention")
    from posbias.attention import kernel

    monkeypatch.setitem(kernel._FLEX_CACHE, "f", fa.flex_attention)
    q, k, v = _qkv(d=16, hkv=2)
    docs = _docs()
    g = GGDBias(4, theta_alpha=[-2.0, -1.0, 0.0, 0.5], theta_beta=[-1.0, 0.0, 1.0, 2.0])
    s = SSMax(4)
    with torch.no_grad():
        s.s.copy_(torch.tensor([0.5, 1.0, 1.5, 2.0]))
    pos = torch.arange(40)
    for bias, norm, dd in [(g, s, docs)]:
        ref = attend(q, k, v, bias=bias, normaliser=norm, doc_ids=dd, backend="eager")
        out = kernel._flex(q, k, v, pos, pos, dd, dd, None, bias, norm, True)
        assert torch.allclose(out, ref, atol=1e-5)
        # decode-style: the last 7 queries against all keys
        out = kernel._flex(q[:, :, 33:], k, v, pos[33:], pos, None if dd is None else dd[:, 33:], dd, None,
                           bias, norm, True)
        assert torch.allclose(out, ref[:, :, 33:], atol=1e-5)


def test_ssmax_max_keys_holds_the_multiplier_at_its_value_beyond_it():
    """``max_keys`` (an evaluation ablation): counts above it count as it; below it nothing changes."""
    ssmax = SSMax(2)
    with torch.no_grad():
        ssmax.s.copy_(torch.tensor([0.5, 2.0]))
    counts = torch.tensor([0, 1, 3, 8, 100])
    free = ssmax.multiplier(counts)
    ssmax.max_keys = 8
    held = ssmax.multiplier(counts)
    assert torch.equal(held[..., :4, :], free[..., :4, :])
    assert torch.allclose(held[0, :, 4, 0], torch.tensor([0.5, 2.0]) * math.log(8))
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 12, 8) for _ in range(3))
    ssmax.max_keys = None
    full = attend(q, k, v, normaliser=ssmax, backend="chunked", chunk_size=4)
    ssmax.max_keys = 12  # no query sees more than 12 keys: identical
    assert torch.equal(attend(q, k, v, normaliser=ssmax, backend="chunked", chunk_size=4), full)
    ssmax.max_keys = 4
    assert not torch.allclose(attend(q, k, v, normaliser=ssmax, backend="chunked", chunk_size=4), full)


# ----------------------------------------------------------------------------- KERPLE and FIRE priors

PRIORS = ("kerple-log", "kerple-power", "fire")


def _prior(name, heads=4, seed=0):
    """A prior of ``name`` with parameters away from any special value (FIRE's threshold inside the length)."""
    from posbias.positional import FIREBias, KerpleLogBias, KerplePowerBias

    torch.manual_seed(seed)
    if name == "kerple-log":
        return KerpleLogBias(heads, r1=[0.3, 1.0, 1.7, 0.05][:heads], r2=[0.9, 0.2, 0.5, 0.02][:heads])
    if name == "kerple-power":
        return KerplePowerBias(heads, r1=[0.8, 0.1, 0.4, 0.02][:heads], r2=[1.9, 0.3, 1.0, 0.6][:heads])
    return FIREBias(heads, hidden=8, c=0.3, threshold=6.0)


def _own_positions(docs):
    """Each token's position inside its document: Long [b, n]."""
    n = docs.shape[1]
    idx = torch.arange(n).expand_as(docs)
    start = torch.ones_like(docs, dtype=torch.bool)
    start[:, 1:] = docs[:, 1:] != docs[:, :-1]
    return idx - torch.where(start, idx, torch.zeros_like(idx)).cummax(-1).values


def _naive_prior(prior, i: int, j: int, i_own: int) -> torch.Tensor:
    """The prior's formula for one (query, key) pair, written out in Python floats: float32 [H]."""
    d = abs(i - j)
    if hasattr(prior, "r1"):
        r1, r2 = prior.constrained()
        if type(prior).__name__ == "KerpleLogBias":
            return torch.tensor([-a * math.log(1 + b * d) for a, b in zip(r1.tolist(), r2.tolist())])
        return torch.tensor([-a * d ** b for a, b in zip(r1.tolist(), r2.tolist())])
    c, big_l = abs(prior.c_raw.item()), abs(prior.l_raw.item()) * prior.threshold
    u = math.log(c * d + 1) / (math.log(c * max(big_l, i_own) + 1) + 1e-6)
    hid = [max(0.0, w * u + b) for w, b in zip(prior.w1.tolist(), prior.b1.tolist())]
    return torch.tensor([sum(w * x for w, x in zip(row, hid)) + b2 for row, b2 in zip(prior.w2.tolist(),
                                                                                        prior.b2.tolist())])


@pytest.mark.parametrize("name", PRIORS)
def test_new_priors_match_a_naive_per_query_loop(name):
    """sdpa / eager / chunked with packed documents and SSMax equal a loop over (b, h, i) with the prior's
    formula written out (FIRE's query position counted inside its document)."""
    q, k, v = _qkv(n=12, h=4)
    prior, s = _prior(name), SSMax(4)
    docs = _docs(n=12)
    own = _own_positions(docs)
    with torch.no_grad():
        s.s.copy_(torch.tensor([0.8, 1.3, 1.0, 0.6]))
        b, h, n, d = q.shape
        ref = torch.zeros_like(q)
        for bi in range(b):
            for i in range(n):
                keys = [j for j in range(i + 1) if docs[bi, j] == docs[bi, i]]
                prior_row = torch.stack([_naive_prior(prior, i, j, int(own[bi, i])) for j in keys])  # [keys, H]
                for hi in range(h):
                    c = torch.stack([q[bi, hi, i] @ k[bi, hi, j] / math.sqrt(d) for j in keys])
                    p = torch.softmax((c + prior_row[:, hi]) * s.s[hi] * math.log(len(keys)), 0)
                    ref[bi, hi, i] = sum(p[t] * v[bi, hi, j] for t, j in enumerate(keys))
        for backend in ("sdpa", "eager", "chunked"):
            out = attend(q, k, v, bias=prior, doc_ids=docs, normaliser=s, backend=backend, chunk_size=5,
                         query_positions=own)
            assert torch.allclose(out, ref, atol=1e-5), backend


@pytest.mark.parametrize("name", PRIORS)
@pytest.mark.parametrize("use_docs", [True, False])
def test_new_priors_chunked_equals_full(name, use_docs):
    q, k, v = _qkv()
    prior = _prior(name)
    docs = _docs() if use_docs else None
    own = _own_positions(docs) if use_docs else None
    full = attend(q, k, v, bias=prior, normaliser=SSMax(4), doc_ids=docs, backend="sdpa", query_positions=own)
    for cs in (1, 7, 16, 64):
        ch = attend(q, k, v, bias=prior, normaliser=SSMax(4), doc_ids=docs, chunk_size=cs, query_positions=own)
        assert torch.allclose(full, ch, atol=1e-5), cs
    # the last queries alone (decode with a KV cache) equal the full rows
    last = attend(q[:, :, -3:], k, v, bias=prior, doc_ids=docs, normaliser=SSMax(4), chunk_size=2,
                  query_positions=None if own is None else own[:, -3:])
    assert torch.allclose(last, full[:, :, -3:], atol=1e-5)


@pytest.mark.parametrize("name", PRIORS)
def test_new_priors_gradients_reach_their_parameters_equally_on_both_paths(name):
    grads = {}
    for backend in ("sdpa", "chunked"):
        q, k, v = (t.clone().requires_grad_(True) for t in _qkv(n=24))
        prior = _prior(name)
        docs = _docs(n=24)
        attend(q, k, v, bias=prior, normaliser=SSMax(4), doc_ids=docs, backend=backend, chunk_size=5,
               query_positions=_own_positions(docs)).pow(2).sum().backward()
        grads[backend] = {n: p.grad for n, p in prior.named_parameters()}
        for n, g in grads[backend].items():
            assert g is not None and torch.isfinite(g).all() and g.abs().sum() > 0, (backend, n)
    for n in grads["sdpa"]:
        assert torch.allclose(grads["sdpa"][n], grads["chunked"][n], atol=1e-4, rtol=1e-4), n


def test_fire_reads_the_query_positions_and_distance_priors_ignore_them():
    """FIRE normalises by the query's own position: other positions change it; KERPLE depends on distance only."""
    q, k, v = _qkv(n=20)
    shifted = torch.arange(20)[None] + 7
    fire = _prior("fire")
    assert not torch.allclose(attend(q, k, v, bias=fire), attend(q, k, v, bias=fire, query_positions=shifted))
    kerple = _prior("kerple-log")
    assert torch.equal(attend(q, k, v, bias=kerple, backend="eager"),
                       attend(q, k, v, bias=kerple, backend="eager", query_positions=shifted))
    with pytest.raises(ValueError, match="query_positions must be"):
        attend(q, k, v, bias=fire, query_positions=torch.arange(5)[None])


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
@pytest.mark.parametrize("name", PRIORS)
def test_flex_score_mod_of_the_new_priors_on_cpu(monkeypatch, name):
    fa = pytest.importorskip("torch.nn.attention.flex_attention")
    from posbias.attention import kernel

    monkeypatch.setitem(kernel._FLEX_CACHE, "f", fa.flex_attention)
    q, k, v = _qkv(d=16, hkv=2)
    docs = _docs()
    own = _own_positions(docs)
    prior, s = _prior(name), SSMax(4)
    pos = torch.arange(40)
    with torch.no_grad():
        ref = attend(q, k, v, bias=prior, normaliser=s, doc_ids=docs, backend="eager", query_positions=own)
        out = kernel._flex(q, k, v, pos, pos, docs, docs, None, prior, s, True, q_index=own)
        assert torch.allclose(out, ref, atol=1e-5)


def test_fire_is_asked_one_query_chunk_at_a_time():
    """The chunked path never builds FIRE's full [H, L, L] bias: each call covers one chunk of query rows."""
    q, k, v = _qkv(b=1, n=64)
    fire = _prior("fire")
    rows = []
    forward = fire.forward
    fire.forward = lambda q_pos, k_pos, q_index=None: rows.append((len(q_pos), len(k_pos))) or forward(
        q_pos, k_pos, q_index)
    with torch.no_grad():
        out = attend(q, k, v, bias=fire, chunk_size=8)
    assert len(rows) == 8 and max(r for r, _ in rows) == 8 and rows[0] == (8, 8) and rows[-1] == (8, 64)
    assert torch.allclose(out, attend(q, k, v, bias=fire, backend="sdpa"), atol=1e-5)
