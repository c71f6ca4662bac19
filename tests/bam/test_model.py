import pytest
import torch

from posbias.bam import BamConfig, BamForCausalLM, build_model

SCHEMES = ["rope", "sinusoidal", "nope", "alibi", "ggd", "kerple-log", "kerple-power", "fire"]
NEW_PRIORS = ["kerple-log", "kerple-power", "fire"]


def _tiny(pe="ggd", normaliser="ssmax", seed=0, **kw):
    torch.manual_seed(seed)
    cfg = dict(num_hidden_layers=2, hidden_size=32, num_attention_heads=4, intermediate_size=64, vocab_size=97,
               pe=pe, normaliser=normaliser, rope_theta=10000.0, fire_threshold=4.0)  # FIRE: L inside the inputs
    cfg.update(kw)
    m = BamForCausalLM(BamConfig(**cfg)).eval()
    with torch.no_grad():  # move priors / SSMax away from their init so a lost parameter shows
        for p in m.prior_parameters():
            p.add_(torch.rand_like(p) * 0.5)
    return m


@pytest.mark.parametrize("pe", SCHEMES)
def test_save_load_roundtrip(tmp_path, pe):
    from transformers import AutoModelForCausalLM

    m = _tiny(pe)
    x = torch.randint(0, 97, (2, 17))
    m.save_pretrained(tmp_path)
    m2 = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert type(m2) is BamForCausalLM and m2.config.pe == pe
    assert torch.equal(m(x).logits, m2(x).logits)


@pytest.mark.parametrize("pe,norm",
                         [("ggd", "ssmax"), ("rope", "softmax"), ("sinusoidal", "ssmax"), ("alibi", "softmax")])
def test_generate_matches_argmax_loop(pe, norm):
    m = _tiny(pe, norm)
    x = torch.randint(3, 97, (2, 6))
    out = m.generate(x, max_new_tokens=8, do_sample=False, pad_token_id=0)
    seq = x
    for _ in range(8):
        nxt = m(seq, use_cache=False).logits[:, -1].argmax(-1, keepdim=True)
        seq = torch.cat([seq, nxt], 1)
    assert torch.equal(out, seq)


def test_cache_step_matches_full():
    m = _tiny("ggd", "ssmax")
    x = torch.randint(0, 97, (1, 12))
    full = m(x, use_cache=False).logits
    o = m(x[:, :7], use_cache=True)
    step = m(x[:, 7:], cache=o.cache, use_cache=True).logits
    assert torch.allclose(step, full[:, 7:], atol=1e-5)


def test_unknown_scheme_and_bad_config():
    with pytest.raises(ValueError, match="unknown positional scheme 'xpos'; known schemes: alibi, fire, ggd"):
        BamConfig(pe="xpos")
    with pytest.raises(ValueError, match="unknown normaliser"):
        BamConfig(normaliser="sparsemax")
    with pytest.raises(ValueError, match="unknown preset"):
        BamConfig.from_preset("huge")
    with pytest.raises(ValueError, match="not divisible"):
        BamConfig(hidden_size=30, num_attention_heads=4)


@pytest.mark.parametrize("pe", ["ggd", "rope"] + NEW_PRIORS)
def test_chunked_long_equals_full(pe):
    m = _tiny(pe, "ssmax")
    x = torch.randint(0, 97, (1, 700))
    full = m(x, attn_backend="sdpa").logits
    keep = torch.tensor([0, 350, 699])
    m.config.ffn_chunk_size = 100
    for layer in m.model.layers:
        layer.ffn_chunk = 100
    ch = m(x, attn_backend="chunked", chunk_size=128, logits_to_keep=keep).logits
    assert ch.shape == (1, 3, 97)
    assert torch.allclose(ch, full[:, keep], atol=1e-5)
    assert torch.allclose(m(x, logits_to_keep=1).logits, full[:, -1:], atol=1e-5)


@pytest.mark.parametrize("pe", ["ggd", "sinusoidal", "rope"] + NEW_PRIORS)
def test_packed_documents_equal_separate(pe):
    m = _tiny(pe, "ssmax")
    a, b = torch.randint(0, 97, (1, 9)), torch.randint(0, 97, (1, 6))
    packed = torch.cat([a, b], 1)
    docs = torch.tensor([[0] * 9 + [1] * 6])
    lp = m(packed, doc_ids=docs).logits
    # rope / ggd / alibi / kerple are relative; sinusoidal and FIRE's query position restart per document
    assert torch.allclose(lp[:, :9], m(a).logits, atol=1e-5)
    assert torch.allclose(lp[:, 9:], m(b).logits, atol=1e-5)


def test_loss_ignores_document_starts():
    m = _tiny()
    x = torch.randint(0, 97, (1, 10))
    docs = torch.tensor([[0] * 5 + [1] * 5])
    loss = m(x, doc_ids=docs, labels=x).loss
    logits = m(x, doc_ids=docs).logits[0]
    tgt = x[0, 1:].clone()
    tgt[4] = -100
    ref = torch.nn.functional.cross_entropy(logits[:-1], tgt, ignore_index=-100)
    assert torch.allclose(loss, ref, atol=1e-6)


def test_ggd_extra_parameter_count():
    base = sum(p.numel() for p in _tiny("nope", "softmax").parameters())
    assert sum(p.numel() for p in _tiny("ggd", "softmax").parameters()) - base == 2 * 4 * 2
    assert sum(p.numel() for p in _tiny("ggd", "softmax", ggd_share_layers=True).parameters()) - base == 2 * 4
    with torch.device("meta"):
        m = build_model("120m", pe="ggd", vocab_size=1000)
    assert sum(p.numel() for p in m.model.priors.parameters()) == 384
    with torch.device("meta"):
        m = build_model("120m", pe="ggd", normaliser="ssmax", vocab_size=1000)
    assert sum(p.numel() for p in m.prior_parameters()) == 384 + 12 * 16


def test_new_priors_parameters_per_layer_and_their_papers_initialisation():
    base = sum(p.numel() for p in _tiny("nope", "softmax").parameters())
    for pe in ("kerple-log", "kerple-power"):
        assert sum(p.numel() for p in _tiny(pe, "softmax").parameters()) - base == 2 * 4 * 2
        assert sum(p.numel() for p in _tiny(pe, "softmax", ggd_share_layers=True).parameters()) - base == 2 * 4
    fire = 32 + 32 + 4 * 32 + 4 + 2  # w1, b1, w2, b2, c, L
    assert sum(p.numel() for p in _tiny("fire", "softmax").parameters()) - base == 2 * fire
    assert sum(p.numel() for p in _tiny("fire", "softmax", ggd_share_layers=True).parameters()) - base == fire
    # built by the model (its _init_weights): the reference's draws, different per layer, and in the optimizer's
    # no-decay group with the other prior parameters
    torch.manual_seed(0)
    m = BamForCausalLM(BamConfig(num_hidden_layers=2, hidden_size=32, num_attention_heads=4, vocab_size=97,
                                 pe="kerple-log"))
    r1 = torch.stack([p.r1 for p in m.model.priors])
    assert 0.01 <= r1.min() and r1.max() <= 2 and not torch.equal(r1[0], r1[1])
    assert {id(p) for p in m.prior_parameters()} == {id(p) for p in m.model.priors.parameters()}
    m = BamForCausalLM(BamConfig(num_hidden_layers=2, hidden_size=32, num_attention_heads=4, vocab_size=97,
                                 pe="fire"))
    f = m.model.priors[1]
    assert f.c().item() == pytest.approx(0.1) and f.threshold_value().item() == 512.0
    assert f.w1.abs().max() <= 1 and 0 < f.w2.abs().max() <= 32 ** -0.5


def test_presets():
    c = BamConfig.from_preset("1b", pe="rope")
    assert (c.num_hidden_layers, c.hidden_size, c.num_attention_heads) == (24, 2048, 64)
    c = BamConfig.from_preset("120m")
    assert (c.num_hidden_layers, c.hidden_size, c.num_attention_heads) == (12, 768, 16)


@pytest.mark.parametrize("pe", ["ggd", "sinusoidal", "fire"])
def test_generate_left_padded_batch_matches_single(pe):
    m = _tiny(pe, "ssmax", pad_token_id=0)
    a, b = torch.randint(3, 97, (1, 7)), torch.randint(3, 97, (1, 4))
    ids = torch.cat([a, torch.cat([torch.zeros(1, 3, dtype=torch.long), b], 1)])
    mask = torch.ones_like(ids)
    mask[1, :3] = 0
    out = m.generate(ids, attention_mask=mask, max_new_tokens=5, do_sample=False, pad_token_id=0)
    assert torch.equal(out[0, 7:], m.generate(a, max_new_tokens=5, do_sample=False, pad_token_id=0)[0, 7:])
    assert torch.equal(out[1, 7:], m.generate(b, max_new_tokens=5, do_sample=False, pad_token_id=0)[0, 4:])


def test_untied_embeddings_roundtrip(tmp_path):
    from transformers import AutoModelForCausalLM

    m = _tiny("alibi", tie_word_embeddings=False)
    assert m.lm_head.weight is not m.model.embed_tokens.weight
    m.save_pretrained(tmp_path)
    m2 = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert torch.equal(m2.lm_head.weight, m.lm_head.weight)
    x = torch.randint(0, 97, (1, 9))
    assert torch.equal(m(x).logits, m2(x).logits)


def test_flex_backend_needs_cuda():
    m = _tiny()
    with pytest.raises(RuntimeError, match="needs a CUDA device"):
        m(torch.randint(0, 97, (1, 5)), attn_backend="flex")


def test_scorers_accept_inputs_beyond_the_training_context():
    """BAM models have no position table: the evaluators must not cap them at the training length."""
    from posbias.bam import BamConfig, BamForCausalLM
    from posbias.evaluation.batching import model_max_positions

    model = BamForCausalLM(BamConfig.from_preset("tiny", pe="ggd", vocab_size=64, max_position_embeddings=16))
    assert model_max_positions(model) == 0


def test_sinusoidal_embeddings_are_scaled_by_sqrt_d_model(tmp_path):
    """Vaswani et al. sec. 3.4: token embeddings x sqrt(d_model) before the (amplitude-1) sinusoidal
    table is added, initialised at std d^-0.5; configs without the field (saved before it existed)
    keep the unscaled input."""
    cfg = BamConfig.from_preset("tiny", pe="sinusoidal", vocab_size=300)
    assert cfg.embed_scale == pytest.approx(cfg.hidden_size ** 0.5)
    assert BamConfig.from_preset("tiny", pe="rope", vocab_size=300).embed_scale is None
    assert BamConfig.from_preset("tiny", pe="sinusoidal", vocab_size=300, embed_scale=1.0).embed_scale == 1.0
    scale = cfg.embed_scale
    torch.manual_seed(0)
    model = BamForCausalLM(cfg).eval()
    ids = torch.randint(3, 300, (1, 12))
    seen = {}
    hook = model.model.layers[0].register_forward_pre_hook(lambda m, a: seen.__setitem__("x", a[0].detach()))
    with torch.no_grad():
        model(input_ids=ids)
        scaled = seen["x"]
        model.config.embed_scale = None  # as a config saved before the field
        model(input_ids=ids)
        plain = seen["x"]
    hook.remove()
    emb = model.model.embed_tokens(ids).detach()
    torch.testing.assert_close(scaled - plain, emb * (scale - 1.0), atol=1e-5, rtol=1e-5)
    # fairseq's Transformer: embeddings start at std d^-0.5, so x sqrt(d) the content has unit
    # variance beside the amplitude-1 table (RMS ~0.71); the other schemes keep initializer_range
    assert cfg.embed_init_std == pytest.approx(cfg.hidden_size ** -0.5)
    assert 0.9 < float((emb * scale).std()) < 1.1
    rope = BamForCausalLM(BamConfig.from_preset("tiny", pe="rope", vocab_size=300))
    assert rope.config.embed_init_std is None and 0.018 < float(rope.model.embed_tokens.weight.detach().std()) < 0.022
    model.config.embed_scale = scale
    model.save_pretrained(tmp_path / "m")
    assert BamForCausalLM.from_pretrained(tmp_path / "m").config.embed_scale == pytest.approx(scale)
    with pytest.raises(ValueError, match="embed_scale"):
        BamConfig(pe="sinusoidal", embed_scale=0)
    with pytest.raises(ValueError, match="embed_init_std"):
        BamConfig(pe="sinusoidal", embed_init_std=-1.0)


def test_ssmax_scope_is_saved_with_the_model(tmp_path):
    from posbias.bam import BamConfig, BamForCausalLM

    cfg = BamConfig.from_preset("tiny", pe="ggd", normaliser="ssmax", ssmax_scope="content", vocab_size=64,
                                num_hidden_layers=1)
    model = BamForCausalLM(cfg)
    assert model.model.layers[0].self_attn.ssmax.scope == "content"
    model.save_pretrained(tmp_path)
    again = BamForCausalLM.from_pretrained(tmp_path)
    assert again.model.layers[0].self_attn.ssmax.scope == "content"
    with pytest.raises(ValueError, match="unknown ssmax_scope"):
        BamConfig(ssmax_scope="prior")


@pytest.mark.parametrize("backend", ["sdpa", "chunked"])
def test_rope_model_equals_hugging_face_llama_with_the_same_weights(backend):
    """The RoPE baseline of the extrapolation study is Llama: same state dict, same logits (GQA too)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    m = _tiny("rope", "softmax", num_key_value_heads=2, rope_theta=500000.0)
    c = m.config
    ref = LlamaForCausalLM(LlamaConfig(
        vocab_size=c.vocab_size, hidden_size=c.hidden_size, intermediate_size=c.intermediate_size,
        num_hidden_layers=c.num_hidden_layers, num_attention_heads=c.num_attention_heads,
        num_key_value_heads=c.num_key_value_heads, rope_theta=c.rope_theta, rms_norm_eps=c.rms_norm_eps,
        tie_word_embeddings=True, max_position_embeddings=64, attn_implementation="eager")).eval()
    missing, unexpected = ref.load_state_dict(m.state_dict(), strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}
    ref.tie_weights()
    x = torch.randint(0, 97, (2, 23))
    ours = m(x, attn_backend=backend, chunk_size=5 if backend == "chunked" else None).logits
    assert torch.allclose(ours, ref(x).logits, atol=2e-5)


@pytest.mark.parametrize("pe", SCHEMES)
@pytest.mark.parametrize("backend", ["sdpa", "chunked"])
def test_kept_logits_skip_the_last_layers_other_rows_exactly(pe, backend):
    """``logits_to_keep = k`` runs the last layer for k query rows only: same logits, same cache."""
    m = _tiny(pe, "ssmax", num_hidden_layers=3)
    x = torch.randint(2, 97, (2, 23))
    mask = torch.ones_like(x)
    mask[1, :5] = 0  # a left-padded row
    kw = dict(attention_mask=mask, attn_backend=backend, chunk_size=8 if backend == "chunked" else None)
    full = m(x, use_cache=True, **kw)
    rows = []
    m.model.layers[-1].mlp.register_forward_hook(lambda mod, inp, out: rows.append(inp[0].shape[1]))
    for k in (1, 4):
        kept = m(x, use_cache=True, logits_to_keep=k, **kw)
        assert kept.logits.shape == (2, k, 97) and rows[-1] == k
        torch.testing.assert_close(kept.logits, full.logits[:, -k:], atol=1e-5, rtol=1e-5)
        for a, b in zip(kept.cache.layers, full.cache.layers):
            torch.testing.assert_close(a.keys, b.keys, atol=0, rtol=0)
            torch.testing.assert_close(a.values, b.values, atol=0, rtol=0)
    docs = torch.tensor([[0] * 9 + [1] * 14] * 2)  # packed documents: the kept rows stay in their own
    torch.testing.assert_close(m(x, doc_ids=docs, logits_to_keep=3).logits, m(x, doc_ids=docs).logits[:, -3:],
                               atol=1e-5, rtol=1e-5)
