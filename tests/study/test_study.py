"""The extrapolation study: long-context grid, plots, GGD readout, attention capture, runner."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from conftest import make_tiny_model

PNG = b"\x89PNG\r\n\x1a\n"


def _png_ok(path) -> bool:
    data = path.read_bytes()
    return len(data) > 1000 and data.startswith(PNG)


def tiny_bam(pe="ggd", normaliser="softmax", **kw):
    from posbias.bam import build_model

    torch.manual_seed(0)
    cfg = dict(pe=pe, normaliser=normaliser, vocab_size=512, hidden_size=32, num_hidden_layers=2,
               num_attention_heads=4, intermediate_size=64, max_position_embeddings=160,
               pad_token_id=0, bos_token_id=1, eos_token_id=2)
    cfg.update(kw)
    return build_model("tiny", **cfg).eval()


# ----------------------------------------------------------------------------- schemes / lengths

def test_parse_schemes_and_lengths():
    from posbias.study.grid import grid_lengths, parse_scheme, parse_schemes

    assert parse_scheme("ggd+ssmax") == ("ggd", "ssmax")
    assert parse_scheme("RoPE") == ("rope", "softmax")
    assert parse_schemes("rope, ggd+ssmax,rope") == ["rope", "ggd+ssmax"]
    for bad in ("xpos", "ggd+foo", "ggd+ssmax+x", ""):
        with pytest.raises(ValueError):
            parse_schemes(bad)
    assert grid_lengths(512, [1, 2, 64]) == [512, 1024, 32768]
    with pytest.raises(ValueError):
        grid_lengths(512, [0])


# ----------------------------------------------------------------------------- long-context grid

def test_length_check_rejects_limited_model_but_not_bam():
    from posbias.evaluation.long_context import LengthBeyondModelError, check_lengths

    llama = make_tiny_model("llama", layers=1, max_positions=256)
    check_lengths(llama, [128, 256])
    with pytest.raises(LengthBeyondModelError, match="at most 256 positions.*512"):
        check_lengths(llama, [128, 512])
    check_lengths(llama, [512], allow_extrapolation=True)
    check_lengths(tiny_bam(), [160, 100_000])  # BAM: any length


def _stub_instances(task, *, tokenizer, n, depths, seed, split, length, **kw):
    from posbias.tasks.base import Instance

    out = []
    for d in depths:
        for i in range(n):
            key = f"{(seed * 7 + i * 13) % 90000 + 10000}"
            filler = "The grass is green. " * max(1, length // 8)
            out.append(Instance(id=f"{task}_s{seed}_d{d}_i{i}", task=task, prompt=f"{filler} The pass key is {key}.",
                                answers=[key], gold_index=0, num_items=1, depth=float(d), metric="passkey",
                                answer_prefix=" The pass key is"))
    return out


def test_run_grid_records_resume_and_summary(tmp_path, monkeypatch, tiny_tokenizer):
    import posbias.evaluation.long_context as lc

    model = make_tiny_model("llama", layers=1, max_positions=512)
    path = tmp_path / "grid.jsonl"
    spec = lc.GridSpec(lengths=[32, 64], depths=[0.0, 1.0], n=2)
    kw = dict(model_name="tiny", out_jsonl=path, make_instances=_stub_instances, progress=False)
    recs = lc.run_grid(model, tiny_tokenizer, spec, **kw)
    assert len(recs) == 8 and len(path.read_text().splitlines()) == 8
    r = recs[0]
    assert {"model", "task", "length", "depth", "id", "tf_em", "tf_logprob", "n_tokens", "prediction",
            "gen_score", "prompt_tokens"} <= set(r)
    assert isinstance(r["tf_em"], bool) and r["n_tokens"] >= 1
    assert r["seconds"] > 0 and r["peak_rss_mb"] > 100  # cost per instance at its length

    # a kill after 5 lines: the rerun scores exactly the 3 missing instances
    lines = path.read_text().splitlines()
    path.write_text("\n".join(lines[:5]) + "\n" + lines[5][:20])  # torn last line
    calls = []
    real = lc._score_chunk
    monkeypatch.setattr(lc, "_score_chunk", lambda m, t, chunk, **k: calls.append(len(chunk)) or real(m, t, chunk, **k))
    bar_kwargs = {}

    class Bar:  # records how the progress bar is opened: a resumed run starts it at what it holds
        def __init__(self, total, **k):
            bar_kwargs.update(k, total=total)

        def update(self, n):
            bar_kwargs["updated"] = bar_kwargs.get("updated", 0) + n

        def close(self):
            pass

    monkeypatch.setattr(lc, "progress_bar", Bar)
    recs2 = lc.run_grid(model, tiny_tokenizer, spec, **kw)
    assert sum(calls) == 3 and len(recs2) == 8
    assert (bar_kwargs["initial"], bar_kwargs["total"], bar_kwargs["updated"]) == (5, 8, 3)
    assert {lc.record_key(x) for x in recs2} == {lc.record_key(x) for x in recs}

    rows = lc.summarize_grid(recs2)
    assert [(x["length"], x["depth"], x["n"]) for x in rows] == [(32, 0.0, 2), (32, 1.0, 2), (64, 0.0, 2), (64, 1.0, 2)]
    by_len = lc.accuracy_by_length(recs2, mode="tf")
    assert set(by_len["tiny"]) == {32, 64}


@pytest.mark.parametrize("task", ["passkey", "niah"])
def test_per_depth_needle_draw_asks_fresh_needles_at_every_depth(task, tiny_tokenizer):
    """shared: the same needles at every depth (the generator's own call); per-depth: each depth its own,
    the same whichever other depths are asked, and the same in every run."""
    from posbias.evaluation.long_context import grid_instances
    from posbias.tasks import make_instances

    kw = dict(task=task, length=400, n=3, seed=0)
    shared = grid_instances(tiny_tokenizer, depths=[0.0, 0.5, 1.0], **kw)
    assert [i.to_dict() for i in shared] == [i.to_dict() for i in make_instances(
        task, tokenizer=tiny_tokenizer, n=3, depths=[0.0, 0.5, 1.0], seed=0, split="eval", length=400)]
    assert len({tuple(i.answers) for i in shared}) == 3  # 9 answers, 3 needles
    fresh = grid_instances(tiny_tokenizer, depths=[0.0, 0.5, 1.0], needle_draw="per-depth", **kw)
    assert [i.depth for i in fresh] == [i.depth for i in shared]
    assert len({tuple(i.answers) for i in fresh}) == 9 and len({i.id for i in fresh}) == 9
    alone = grid_instances(tiny_tokenizer, depths=[0.5], needle_draw="per-depth", **kw)
    assert [i.to_dict() for i in alone] == [i.to_dict() for i in fresh[3:6]]
    assert [i.to_dict() for i in fresh] == [
        i.to_dict() for i in grid_instances(tiny_tokenizer, depths=[0.0, 0.5, 1.0], needle_draw="per-depth", **kw)]
    with pytest.raises(ValueError, match="needle draw 'fresh' is not one of shared, per-depth"):
        grid_instances(tiny_tokenizer, depths=[0.5], needle_draw="fresh", **kw)


def test_depth_seed_is_a_stable_hash_of_seed_and_depth():
    from posbias.tasks.base import depth_seed

    seeds = {depth_seed(s, d) for s in (0, 1) for d in (0.0, 0.25, 0.5, 0.75, 1.0)}
    assert len(seeds) == 10 and all(0 <= x < 2 ** 31 for x in seeds)
    assert depth_seed(0, 0.5) == depth_seed(0, 0.5) == 97009465  # pinned: the instances of earlier runs stay the same


def test_run_grid_teacher_forced_matches_perfect_model(tmp_path, tiny_tokenizer):
    """A model that always predicts the gold next token gets tf_em = True everywhere."""
    from posbias.evaluation.long_context import GridSpec, run_grid

    class Oracle(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(1))
            self.config = type("C", (), {"max_position_embeddings": 0})()
            self.targets: dict = {}

        def forward(self, input_ids, logits_to_keep=0, **kw):
            B, T = input_ids.shape
            logits = torch.zeros(B, T, 512)
            # predict the next token of the row itself (teacher forcing sees the gold answer)
            logits[:, :-1].scatter_(-1, input_ids[:, 1:, None], 10.0)
            if logits_to_keep:
                logits = logits[:, -logits_to_keep:]
            return type("O", (), {"logits": logits})()

    spec = GridSpec(lengths=[24], depths=[0.5], n=3, modes=["teacher_forced"])
    recs = run_grid(Oracle(), tiny_tokenizer, spec, model_name="oracle", out_jsonl=tmp_path / "g.jsonl",
                    make_instances=_stub_instances, progress=False)
    assert len(recs) == 3 and all(r["tf_em"] for r in recs) and "gen_score" not in recs[0]


def test_run_grid_on_bam_beyond_training_length(tmp_path, tiny_tokenizer):
    """A BAM model (max_position_embeddings = training context 160) runs the grid at 2x, both modes,
    with the real passkey generator."""
    from posbias.evaluation.long_context import GridSpec, run_grid

    model = tiny_bam("ggd", "ssmax")
    recs = run_grid(model, tiny_tokenizer, GridSpec(lengths=[160, 320], depths=[0.0, 1.0], n=1), model_name="bam",
                    out_jsonl=tmp_path / "g.jsonl", progress=False)
    assert len(recs) == 4
    assert all(r["prompt_tokens"] <= r["length"] for r in recs)
    assert max(r["prompt_tokens"] for r in recs) > 160
    assert all(isinstance(r["prediction"], str) for r in recs)


def test_study_grid_also_runs_passkey_in_the_essay_haystack(tmp_path, tiny_tokenizer):
    """passkey_essay: the same keys in a filler the models never trained on, in its own file."""
    from posbias.study.config import StudyConfig
    from posbias.study.grid import PASSKEY_ESSAY_FILE, PASSKEY_FILE, evaluate_model
    from posbias.tasks.haystack import NOISE

    model = tiny_bam("alibi")
    cfg = StudyConfig(out=str(tmp_path), train_context=160, multipliers=[1], depths=[0.5], n=2, passkey_essay=True,
                      ppl_multipliers=[])
    res = evaluate_model(model, tiny_tokenizer, cfg, name="alibi", progress=False)
    assert set(res) == {"passkey", "passkey-essay"}
    assert (tmp_path / PASSKEY_FILE).exists() and (tmp_path / PASSKEY_ESSAY_FILE).exists()
    assert [r["answers"] for r in res["passkey"]] == [r["answers"] for r in res["passkey-essay"]]
    from posbias.tasks import make_instances

    inst = make_instances("passkey", tokenizer=tiny_tokenizer, n=1, depths=[0.5], seed=0, length=160,
                          haystack="essay")[0]
    assert NOISE not in inst.prompt


def test_raw_prompt_matches_the_training_passkey_documents(tiny_tokenizer):
    """The grid's raw (chat=False) passkey text ends like the trainer's passkey documents."""
    from posbias.evaluation.batching import prompt_text
    from posbias.tasks import make_instances

    inst = make_instances("passkey", tokenizer=tiny_tokenizer, n=1, depths=[0.5], seed=0, length=200)[0]
    assert prompt_text(tiny_tokenizer, inst, False).endswith("\nWhat is the pass key? The pass key is")


@pytest.mark.parametrize("which", ["llama", "bam"])
def test_shared_prefill_equals_two_pass_scorers(which, tiny_tokenizer):
    """One prefill for both modes gives the lead scorers' results (teacher-forced em / logprob,
    greedy text)."""
    from posbias.evaluation.generation import greedy_generate, score_shared_prefill
    from posbias.evaluation.teacher_forced import score_teacher_forced
    from posbias.tasks import make_instances

    model = make_tiny_model("llama", layers=2, max_positions=1024) if which == "llama" else \
        tiny_bam("ggd", "ssmax", max_position_embeddings=1024)
    insts = make_instances("passkey", tokenizer=tiny_tokenizer, n=2, depths=[0.0, 1.0], seed=3, length=200)
    tf = score_teacher_forced(model, tiny_tokenizer, insts, batch_size=1, chat=True)
    gen = greedy_generate(model, tiny_tokenizer, insts, max_new_tokens=7, batch_size=1, chat=True)
    for inst, t, g in zip(insts, tf, gen):
        r = score_shared_prefill(model, tiny_tokenizer, inst, chat=True, max_new_tokens=7)
        assert r["tf_em"] == t["em"] and r["n_tokens"] == t["n_tokens"]
        assert r["tf_logprob"] == pytest.approx(t["logprob"], abs=1e-3)
        assert r["prediction"] == g


def test_shared_prefill_em_for_a_model_that_knows_the_answer(tiny_tokenizer):
    """A model that copies the gold digits scores tf_em = True and generates the key."""
    from posbias.evaluation.batching import encode
    from posbias.evaluation.generation import score_shared_prefill
    from posbias.tasks import make_instances

    inst = make_instances("passkey", tokenizer=tiny_tokenizer, n=1, depths=[0.5], seed=0, length=200)[0]
    enc = encode(tiny_tokenizer, inst, True)
    full = enc.prompt_ids + enc.answer_ids + [tiny_tokenizer.eos_token_id]
    P = len(enc.prompt_ids)

    class Copy(torch.nn.Module):
        """Predicts full[pos + 1] at every position (positions read from the cache length)."""

        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(1))
            self.config = type("C", (), {"max_position_embeddings": 0})()

        def forward(self, input_ids, cache=None, logits_to_keep=0, **kw):
            from transformers.cache_utils import DynamicCache

            cache = cache if cache is not None else DynamicCache()
            past = cache.get_seq_length()
            n = input_ids.shape[1]
            kv = torch.zeros(1, 1, n, 2)
            cache.update(kv, kv, 0)
            logits = torch.zeros(1, n, 512)
            for i in range(n):
                logits[0, i, full[min(past + i + 1, len(full) - 1)]] = 5.0
            if logits_to_keep:
                logits = logits[:, -logits_to_keep:]
            return type("O", (), {"logits": logits, "cache": cache})()

    r = score_shared_prefill(Copy(), tiny_tokenizer, inst, chat=True, max_new_tokens=12)
    assert r["tf_em"] and r["prompt_tokens"] == P
    assert inst.answers[0] in r["prediction"]


# ----------------------------------------------------------------------------- plots

def test_plot_functions_write_pngs(tmp_path):
    from posbias.study.plots import plot_accuracy_vs_length, plot_heatmap, plot_perplexity_vs_length

    rows = [{"length": L, "depth": d, "tf_acc": (L + d) % 1.0 if L < 4096 else 0.0, "gen_acc": None}
            for L in (512, 1024, 4096) for d in (0.0, 0.5, 1.0)]
    assert _png_ok(plot_heatmap(rows, tmp_path / "h.png", title="ggd", train_context=512))
    curves = {"rope": {512: 1.0, 1024: 0.2, 4096: 0.0}, "ggd+ssmax": {512: 1.0, 1024: 1.0, 4096: 0.9}}
    assert _png_ok(plot_accuracy_vs_length(curves, tmp_path / "a.png", train_context=512))
    ppl = [{"model": m, "context": c, "mode": mode, "ppl": p}
           for m, base in (("rope", 20.0), ("ggd", 18.0)) for c in (512, 1024, 2048)
           for mode, p in (("non-overlapping", base * c / 512), ("sliding", base if m == "ggd" else math.inf))]
    assert _png_ok(plot_perplexity_vs_length(ppl, tmp_path / "p.png", train_context=512))


# ----------------------------------------------------------------------------- GGD readout

def test_ggd_alpha_beta_formula():
    from posbias.study.priors import ggd_alpha_beta, ggd_bias

    ta, tb = math.log(0.5), 1.5
    alpha, beta = ggd_alpha_beta(ta, tb)
    assert beta == tb and alpha == pytest.approx(math.exp(-ta / tb))
    d = torch.tensor([1.0, 3.0, 10.0, 1000.0])
    b = ggd_bias([ta], [tb], d, eps=0.0)[0]
    assert torch.allclose(b, -(d.double() / alpha).abs() ** beta, rtol=1e-9)
    assert ggd_bias([ta], [tb], torch.tensor([alpha]), eps=0.0).item() == pytest.approx(-1.0)
    assert ggd_alpha_beta(0.3, 0.0) == (math.inf, 0.0)


def test_ggd_priors_of_bam_model_and_plot(tmp_path):
    from posbias.positional.ggd import GGDBias
    from posbias.study.priors import ggd_bias, ggd_priors, plot_priors, priors_table

    model = tiny_bam("ggd")
    with torch.no_grad():
        for li, prior in enumerate(model.model.priors):
            prior.theta_alpha.copy_(torch.tensor([-1.0, 0.0, 0.5, -2.0]))
            prior.theta_beta.copy_(torch.tensor([1.0, 0.0, -0.5, 0.7]) + li)
    pr = ggd_priors(model)
    assert len(pr) == 2 * 4 and {p["layer"] for p in pr} == {0, 1}
    p = [x for x in pr if x["layer"] == 0 and x["head"] == 2][0]
    assert p["beta"] == pytest.approx(-0.5) and p["alpha"] == pytest.approx(math.exp(1.0))  # exp(-0.5 / -0.5)
    # the readout curve equals the module's own bias
    mod = model.model.priors[0]
    assert isinstance(mod, GGDBias)
    k = torch.arange(0, 50)
    own = mod(torch.tensor([49]), k)[:, 0, :].double()  # [H, 50], distance 49 - k
    ours = ggd_bias(mod.theta_alpha.detach(), mod.theta_beta.detach(), (49 - k).double(), eps=mod.eps)
    assert torch.allclose(own, ours, rtol=1e-4)
    assert _png_ok(plot_priors(pr, tmp_path / "priors.png", max_distance=4096))
    assert "yes" in priors_table(pr)  # beta <= 0 heads marked

    shared = tiny_bam("ggd", ggd_share_layers=True)
    assert {p["layer"] for p in ggd_priors(shared)} == {None}
    assert ggd_priors(tiny_bam("rope")) == []


# ----------------------------------------------------------------------------- attention maps

@torch.no_grad()
def test_attend_returns_the_probabilities_of_its_own_output():
    from posbias.attention import SSMax, attend
    from posbias.positional.ggd import GGDBias

    torch.manual_seed(0)
    q, k, v = torch.randn(1, 4, 40, 8), torch.randn(1, 2, 40, 8), torch.randn(1, 2, 40, 8)
    bias = GGDBias(4, "linear")
    ssmax = SSMax(4, 1.0)
    docs = torch.tensor([[0] * 15 + [1] * 25])
    for kw in (dict(backend="sdpa"), dict(backend="chunked", chunk_size=16), dict(backend="chunked", doc_ids=docs)):
        ref = attend(q, k, v, bias=bias, normaliser=ssmax, **kw)
        got, p = attend(q, k, v, bias=bias, normaliser=ssmax, return_probs=True, **kw)
        assert torch.allclose(ref, got, atol=1e-5)
        assert p.shape == (1, 4, 40, 40)
        assert torch.allclose(p.sum(-1), torch.ones(1, 4, 40), atol=1e-5)
        assert float(p[0, :, 3, 4:].abs().max()) == 0.0  # causal
        vv = v.repeat_interleave(2, dim=1)
        assert torch.allclose(torch.matmul(p, vv), ref, atol=1e-5)  # the probabilities that made the output
    _, p = attend(q, k, v, bias=bias, normaliser=ssmax, doc_ids=docs, return_probs=True)
    assert float(p[0, :, 20, :15].abs().max()) == 0.0
    # queries = the last 5 of 40 keys (KV cache)
    ref = attend(q[:, :, -5:], k, v, bias=bias, normaliser=ssmax)
    got, _ = attend(q[:, :, -5:], k, v, bias=bias, normaliser=ssmax, return_probs=True)
    assert torch.allclose(ref, got, atol=1e-5)


def test_attention_maps_bam_and_hf_and_plot(tmp_path):
    from posbias.study.priors import attention_maps, plot_attention_maps

    ids = torch.randint(3, 500, (30,), generator=torch.Generator().manual_seed(0))
    bam = tiny_bam("alibi", "ssmax")
    a = attention_maps(bam, ids)
    assert a.shape == (2, 4, 30, 30)
    assert torch.allclose(a.sum(-1), torch.ones(2, 4, 30), atol=1e-5)
    # the model's output is unchanged when it also returns its attention
    with torch.no_grad():
        ref = bam(input_ids=ids[None]).logits
        got = bam(input_ids=ids[None], output_attentions=True)
    assert torch.allclose(ref, got.logits, atol=1e-4) and len(got.attentions) == 2
    llama = make_tiny_model("llama", layers=2)
    b = attention_maps(llama, ids)
    assert b.shape == (2, 4, 30, 30)
    assert _png_ok(plot_attention_maps(a, tmp_path / "attn.png", layers=[0, 1], heads=[0, 1, 2], marks={"needle": 10}))
    assert _png_ok(plot_attention_maps(torch.softmax(torch.randn(1, 2, 300, 300), -1), tmp_path / "big.png",
                                       max_tokens=64))


# ----------------------------------------------------------------------------- runner end-to-end

@pytest.fixture
def fake_train(tmp_path, monkeypatch, tiny_tokenizer):
    """``posbias.training.train`` stand-in: saves an untrained tiny BAM model of the asked scheme."""
    import posbias.study.runner as runner
    import posbias.study.training as training
    from posbias.study.estimate import StudyEstimate

    monkeypatch.setattr(training, "_train_config_class", lambda: None)  # plain dict configs
    monkeypatch.setattr(training, "study_tokenizer", lambda spec: tiny_tokenizer)  # the one the models save
    # the estimate times the trainer's own config, which plain dict configs are not (tests/study/test_estimate.py)
    monkeypatch.setattr(runner, "estimate_study", lambda *a, **k: StudyEstimate(0.0, 0.0, 0, 0.0, 0))
    calls = []

    def train(config):
        calls.append(config)
        model = tiny_bam(config["pe"], config["normaliser"], max_position_embeddings=config["context"])
        model.save_pretrained(config["out"])
        tiny_tokenizer.save_pretrained(config["out"])
        return config["out"]

    return train, calls


def _corpus(tmp_path):
    path = tmp_path / "corpus.jsonl"
    lines = [json.dumps({"text": f"Document {i}. The grass is green. The sky is blue. Here we go. " * 6})
             for i in range(40)]
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def test_study_end_to_end_and_resume(tmp_path, fake_train):
    from posbias.study.runner import StudyConfig, run_study

    train, calls = fake_train
    out = tmp_path / "study"
    kw = dict(out=str(out), preset="tiny", schemes="rope,ggd+ssmax", train_steps=3, train_context=160,
              multipliers=[1, 2], depths=[0.5], n=1, seed=0, corpus=_corpus(tmp_path), ppl_multipliers=[1, 2],
              ppl_tokens=400)
    res = run_study(StudyConfig(**kw), train_fn=train, progress=False, log=lambda *a: None)
    assert [c["pe"] for c in calls] == ["rope", "ggd"] and calls[1]["normaliser"] == "ssmax"
    # identical budget; every scheme trains on the corpus minus the held-out tail
    train_file = out / "data" / "train.jsonl"
    assert all(c["steps"] == 3 and c["context"] == 160 and c["seed"] == 0 and c["passkey_rate"] == 0.1
               and c["corpus"] == [str(train_file.resolve())] for c in calls)
    train_docs = [json.loads(x)["text"] for x in train_file.read_text().splitlines()]
    held_docs = [json.loads(x)["text"] for x in (out / "data" / "heldout.jsonl").read_text().splitlines()]
    original = [json.loads(x)["text"] for x in open(kw["corpus"]).read().splitlines()]
    assert "".join(train_docs + held_docs) == "".join(original)
    assert 400 * 6 <= sum(map(len, held_docs)) <= 0.3 * sum(map(len, original)) + 1
    assert set(res["models"]) == {"rope", "ggd+ssmax"}
    pk = (out / "passkey.jsonl").read_text().splitlines()
    assert len(pk) == 2 * 2 * 1  # schemes x lengths x depths x n
    ppl = [json.loads(x) for x in (out / "perplexity.jsonl").read_text().splitlines()]
    assert {(r["model"], r["context"], r["mode"]) for r in ppl} == {
        (m, c, mode) for m in ("rope", "ggd+ssmax") for c in (160, 320) for mode in ("non-overlapping", "sliding")}
    # the training text's perplexity at the training context, beside the held-out one (memorisation check)
    train_ppl = [json.loads(x) for x in (out / "perplexity-train.jsonl").read_text().splitlines()]
    assert [(r["model"], r["context"], r["mode"], r["text"]) for r in train_ppl] == [
        (m, 160, "non-overlapping", "training") for m in ("rope", "ggd+ssmax")]
    metrics = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    kinds = {m["kind"] for m in metrics}
    assert {"passkey_cell", "passkey_tf_by_length", "passkey_gen_by_length", "perplexity", "perplexity_train"} <= kinds
    gap = {m["model"]: m for m in metrics if m["kind"] == "perplexity_train"}
    held = {r["model"]: r["ppl"] for r in ppl if r["context"] == 160 and r["mode"] == "non-overlapping"}
    assert all(gap[m]["ratio"] == pytest.approx(held[m] / gap[m]["ppl_train"]) for m in ("rope", "ggd+ssmax"))
    summary = (out / "summary.md").read_text()
    assert "ggd+ssmax" in summary and "320 (2x)" in summary and "Learned GGD priors" in summary
    assert "Perplexity on the training text vs the held-out text" in summary
    plots = {p.name for p in (out / "plots").glob("*.png")}
    assert {"passkey_tf_accuracy_vs_length.png", "passkey_gen_accuracy_vs_length.png", "perplexity_vs_length.png",
            "passkey_heatmap_rope_tf.png", "passkey_heatmap_ggd_ssmax_gen.png", "priors_ggd_ssmax.png",
            "attention_rope.png", "attention_ggd_ssmax.png"} <= plots
    assert all(_png_ok(out / "plots" / p) for p in plots)

    # without resume=True an existing study is refused; with it nothing is retrained or rescored
    with pytest.raises(ValueError, match="resume=True"):
        run_study(StudyConfig(**kw), train_fn=train, progress=False, log=lambda *a: None)
    run_study(StudyConfig(**kw, resume=True), train_fn=train, progress=False, log=lambda *a: None)
    assert len(calls) == 2
    assert (out / "passkey.jsonl").read_text().splitlines() == pk
    # a later run adds a length for one scheme only; the report still covers every model
    run_study(StudyConfig(**{**kw, "schemes": "ggd+ssmax", "multipliers": [4]}, resume=True), train_fn=train,
              progress=False, log=lambda *a: None)
    assert len(calls) == 2 and len((out / "passkey.jsonl").read_text().splitlines()) == len(pk) + 1
    summary = (out / "summary.md").read_text()
    assert "| rope | 0 [0, 79] | 0 [0, 79] |  |" in summary and "640 (4x)" in summary  # n = 1: Wilson interval
    # a resume with other training settings is refused
    with pytest.raises(ValueError, match="train_steps"):
        run_study(StudyConfig(**{**kw, "train_steps": 4}, resume=True), train_fn=train, progress=False,
                  log=lambda *a: None)


def test_train_config_is_the_trainers(tmp_path):
    """Schemes differ only in pe / ssmax; the config is posbias.training.TrainConfig."""
    from posbias.study.runner import StudyConfig, train_config
    from posbias.training import TrainConfig

    cfg = StudyConfig(out=str(tmp_path / "s"), preset="tiny", train_steps=7, train_context=256, seed=3,
                      corpus="c.jsonl", train_options={"batch_size": 2})
    a = train_config(cfg, "rope", tmp_path / "m1")
    b = train_config(cfg, "ggd+ssmax", tmp_path / "m2")
    assert isinstance(a, TrainConfig) and (a.pe, a.ssmax, b.pe, b.ssmax) == ("rope", False, "ggd", True)
    da, db = a.to_json(), b.to_json()
    assert {k for k in da if da[k] != db[k]} == {"pe", "ssmax", "out"}
    assert (a.steps, a.context, a.seed, a.corpus, a.batch_size, a.passkey_rate, a.resume) == \
        (7, 256, 3, ["c.jsonl"], 2, 0.1, False)
    (tmp_path / "m1").mkdir()
    (tmp_path / "m1" / "checkpoint.pt").write_text("x")
    assert train_config(cfg, "rope", tmp_path / "m1").resume  # a killed training run continues
    with pytest.raises(ValueError, match="unknown training option"):
        train_config(StudyConfig(out=str(tmp_path / "s"), train_options={"nope": 1}), "rope", tmp_path / "m3")


def test_study_cli(tmp_path, fake_train, monkeypatch):
    from typer.testing import CliRunner

    import posbias.study.training as training
    from posbias.cli.main import app

    train, calls = fake_train
    monkeypatch.setattr(training, "default_train_fn", lambda: train)
    out = tmp_path / "s"
    args = ["study", "--out", str(out), "--schemes", "nope", "--train-steps", "2", "--train-context", "160",
            "--multipliers", "1", "--depths", "0.5", "--n", "1", "--ppl-multipliers", "", "--niah",
            "--niah-opt", "num_needles=2", "--modes", "teacher_forced", "--multipliers", "2"]
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 0, r.output
    assert "passkey, teacher-forced accuracy" in r.output and "niah, teacher-forced accuracy" in r.output
    assert len(calls) == 1 and calls[0]["pe"] == "nope"
    niah = [json.loads(x) for x in (out / "niah.jsonl").read_text().splitlines()]
    assert len(niah) == 1 and niah[0]["metric"] == "string_match_all" and "gen_score" not in niah[0]
    r = CliRunner().invoke(app, args[:-2] + ["--schemes", "xpos"])
    assert r.exit_code == 2 and "bad scheme" in r.output


def test_a_passkey_prompt_that_cannot_fit_is_refused_before_any_training(tmp_path, fake_train, monkeypatch):
    from typer.testing import CliRunner

    import posbias.study.training as training
    from posbias.cli.main import app

    train, calls = fake_train
    monkeypatch.setattr(training, "default_train_fn", lambda: train)
    out = tmp_path / "s"

    def study(context: int, multipliers: str):
        return CliRunner().invoke(app, [
            "study", "--out", str(out), "--schemes", "rope,nope", "--train-steps", "2", "--train-context",
            str(context), "--multipliers", multipliers, "--depths", "0.5", "--n", "1", "--ppl-multipliers", ""])

    r = study(16, "1,64")
    assert r.exit_code == 2 and calls == [], r.output
    lines = r.output.strip().splitlines()
    assert len(lines) == 1 and "shortest length cannot hold its passkey prompt" in lines[0], r.output
    assert "length 16 is too small" in lines[0] and "nothing was trained" in lines[0]
    r = study(16, "2,64")  # the shortest evaluated length is the one checked
    assert r.exit_code == 2 and calls == [] and "length 32 is too small" in r.output, r.output
    r = study(160, "1")  # a context that holds it trains
    assert r.exit_code == 0 and len(calls) == 2, r.output


def test_a_resumed_study_says_how_many_models_were_trained(tmp_path, fake_train, capsys):
    from posbias.study.runner import StudyConfig, run_study

    train, calls = fake_train
    out = tmp_path / "study"
    kw = dict(out=str(out), schemes="rope,alibi", train_steps=2, train_context=160, multipliers=[1], depths=[0.5],
              n=1, ppl_multipliers=[], corpus=_corpus(tmp_path))

    def killed_at_alibi(config):
        if config["pe"] == "alibi":
            raise KeyboardInterrupt
        return train(config)

    with pytest.raises(KeyboardInterrupt):
        run_study(StudyConfig(**kw), train_fn=killed_at_alibi, progress=False, log=lambda *a: None)
    assert "resuming" not in capsys.readouterr().err
    run_study(StudyConfig(**kw, resume=True), train_fn=train, progress=False, log=lambda *a: None)
    assert f"resuming 1 of 2 trained models already in {out}" in capsys.readouterr().err
    assert [c["pe"] for c in calls] == ["rope", "alibi"]


def test_study_config_json_fed_back_resumes_the_same_study(tmp_path, fake_train, monkeypatch):
    from typer.testing import CliRunner

    import posbias.study.training as training
    from posbias.cli.main import app

    train, calls = fake_train
    monkeypatch.setattr(training, "default_train_fn", lambda: train)
    out = tmp_path / "s"
    args = ["study", "--out", str(out), "--schemes", "nope", "--train-steps", "2", "--train-context", "160",
            "--multipliers", "1", "--depths", "0.5", "--n", "1", "--ppl-multipliers", "", "--modes", "teacher-forced",
            "--train-opt", "probe_tasks=passkey", "--n-beyond", "1=1"]
    assert CliRunner().invoke(app, args).exit_code == 0
    first = json.loads((out / "config.json").read_text())["config"]
    results = (out / "passkey.jsonl").read_text()
    r = CliRunner().invoke(app, ["study", "--config", str(out / "config.json")])
    assert r.exit_code == 0, r.output
    again = json.loads((out / "config.json").read_text())["config"]
    assert {**again, "resume": False} == first and again["train_options"] == {"probe_tasks": ["passkey"]}
    assert len(calls) == 1 and (out / "passkey.jsonl").read_text() == results  # nothing retrained or rescored
    # a flag given beside the file wins: a new depth is scored in the same study
    r = CliRunner().invoke(app, ["study", "--config", str(out / "config.json"), "--depths", "0.5,1"])
    assert r.exit_code == 2 and "depths" in r.output  # depths are part of a study's identity
    toml = tmp_path / "study.toml"
    toml.write_text(f'out = "{tmp_path / "t"}"\nschemes = ["nope"]\ntrain_steps = 2\ntrain_context = 160\n'
                    'multipliers = [1]\ndepths = [0.5]\nn = 1\nppl_multipliers = []\nmodes = ["teacher-forced"]\n')
    r = CliRunner().invoke(app, ["study", "--config", str(toml), "--seed", "1"])
    assert r.exit_code == 0, r.output
    assert json.loads((tmp_path / "t" / "config.json").read_text())["config"]["seed"] == 1 and len(calls) == 2


def test_study_bpe_tokenizer_is_trained_once_and_shared(tmp_path, fake_train):
    from posbias.study.runner import StudyConfig, prepare_tokenizer, train_config

    train, calls = fake_train
    out = tmp_path / "study"
    cfg = StudyConfig(out=str(out), schemes="rope,alibi", train_steps=2, train_context=160, multipliers=[1],
                      depths=[0.5], n=1, corpus=_corpus(tmp_path), ppl_multipliers=[], tokenizer="bpe:320")
    path = prepare_tokenizer(cfg, cfg.corpus, log=lambda *a: None)
    assert path == str((out / "tokenizer").resolve()) and (out / "tokenizer" / "tokenizer.json").exists()
    a, b = train_config(cfg, "rope", out / "m1"), train_config(cfg, "alibi", out / "m2")
    assert a["tokenizer"] == b["tokenizer"] == path  # every scheme gets the same trained vocabulary
    assert prepare_tokenizer(StudyConfig(out=str(tmp_path / "x"), tokenizer=None), None) is None


def _picklable_fake_train(config):
    """Module-level stand-in trainer (spawned worker processes must be able to import it)."""
    import os

    from conftest import make_tiny_tokenizer

    model = tiny_bam(config["pe"], config["normaliser"], max_position_embeddings=config["context"])
    model.save_pretrained(config["out"])
    make_tiny_tokenizer().save_pretrained(config["out"])
    (Path(config["out"]) / "pid").write_text(str(os.getpid()))
    return config["out"]


def test_study_trains_schemes_in_parallel_workers(tmp_path, monkeypatch):
    import os

    import posbias.study.training as training
    from posbias.study.runner import StudyConfig, ensure_models

    monkeypatch.setattr(training, "_train_config_class", lambda: None)
    cfg = StudyConfig(out=str(tmp_path / "s"), schemes="rope,alibi,nope", train_steps=2, train_context=160,
                      train_workers=2)
    models = ensure_models(cfg, train_fn=_picklable_fake_train, log=lambda *a: None)
    assert set(models) == {"rope", "alibi", "nope"}
    saved = json.loads((tmp_path / "s" / "models.json").read_text())
    assert set(saved) == set(models) and all((tmp_path / "s" / p / "config.json").exists() for p in saved.values())
    pids = {(Path(p) / "pid").read_text() for p in models.values()}
    assert str(os.getpid()) not in pids  # trained in worker processes
    with pytest.raises(ValueError, match="train_workers"):
        StudyConfig(out=str(tmp_path / "t"), train_workers=0)


def test_training_table_reads_trainer_metrics(tmp_path):
    from posbias.study.report import trainer_logs, training_table

    folder = tmp_path / "models" / "ggd_ssmax"
    folder.mkdir(parents=True)
    recs = [{"step": 10 * i, "loss": 5.0 - 0.1 * i, "tokens": 2048 * 10 * i, "elapsed_s": 6.0 * i} for i in range(1,
                                                                                                                  21)]
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    table = training_table(tmp_path, trainer_logs(tmp_path, ["rope", "ggd+ssmax"]))
    assert "| ggd+ssmax | 200 | 0.41M | 3.050 | 2.0 |" in table  # mean loss of the last 2 of 20 logs
    assert "| rope |" not in table and training_table(tmp_path, trainer_logs(tmp_path, ["rope"])) == ""


def test_resume_may_raise_n_but_not_lower_it(tmp_path, fake_train):
    from posbias.study.runner import StudyConfig, run_study

    train, calls = fake_train
    out = tmp_path / "study"
    kw = dict(out=str(out), schemes="nope", train_steps=2, train_context=160, multipliers=[1], depths=[0.5],
              ppl_multipliers=[], modes=["teacher_forced"])
    quiet = dict(train_fn=train, progress=False, log=lambda *a: None)
    run_study(StudyConfig(**kw, n=1), **quiet)
    first = (out / "passkey.jsonl").read_text().splitlines()
    run_study(StudyConfig(**kw, n=3, resume=True), **quiet)
    lines = (out / "passkey.jsonl").read_text().splitlines()
    assert lines[:1] == first and len(lines) == 3 and len(calls) == 1  # only the 2 new instances scored
    assert "Note (passkey)" not in (out / "summary.md").read_text()
    with pytest.raises(ValueError, match="raise n, not lower it"):
        run_study(StudyConfig(**kw, n=2, resume=True), **quiet)


def test_far_lengths_may_hold_fewer_instances_per_cell(tmp_path, fake_train):
    from posbias.study.runner import StudyConfig, run_study

    train, _calls = fake_train
    out = tmp_path / "study"
    kw = dict(out=str(out), schemes="nope", train_steps=2, train_context=160, multipliers=[1, 2, 4], depths=[0, 1],
              ppl_multipliers=[], modes=["teacher_forced"], n=3)
    quiet = dict(train_fn=train, progress=False, log=lambda *a: None)
    cfg = StudyConfig(**kw, n_beyond={"1": 2, "2": 1})  # beyond 1x: 2 per cell; beyond 2x: 1 per cell
    assert [cfg.n_at(L) for L in (160, 161, 320, 321, 640)] == [3, 2, 2, 1, 1]
    run_study(cfg, **quiet)
    recs = [json.loads(x) for x in (out / "passkey.jsonl").read_text().splitlines()]
    assert {L: sum(r["length"] == L for r in recs) for L in (160, 320, 640)} == {160: 6, 320: 4, 640: 2}
    summary = (out / "summary.md").read_text()
    assert "n = 3 per cell (2 beyond 1x, 1 beyond 2x)" in summary and "Note (passkey)" not in summary
    run_study(StudyConfig(**kw, resume=True), **quiet)  # the same folder without --n-beyond: the far cells grow
    recs = [json.loads(x) for x in (out / "passkey.jsonl").read_text().splitlines()]
    assert {L: sum(r["length"] == L for r in recs) for L in (160, 320, 640)} == {160: 6, 320: 6, 640: 6}
    run_study(StudyConfig(**kw, n_beyond={"2": 1}, resume=True), **quiet)  # cells larger than asked: said so
    assert "cells hold another number of instances than asked here at 640 tokens (3, not 1)" in \
        (out / "summary.md").read_text()
    for bad in ({"64": 0}, {"x": 3}, {"-1": 2}, {"64": 2.5}):
        with pytest.raises(ValueError, match="--n-beyond"):
            StudyConfig(**kw, n_beyond=bad)


def test_study_per_depth_needles_are_kept_on_resume_and_reported(tmp_path, fake_train):
    from posbias.study.runner import StudyConfig, run_study

    train, calls = fake_train
    out = tmp_path / "study"
    kw = dict(out=str(out), schemes="nope", train_steps=2, train_context=160, multipliers=[1], depths=[0.0, 1.0],
              n=2, ppl_multipliers=[], modes=["teacher_forced"])
    quiet = dict(train_fn=train, progress=False, log=lambda *a: None)
    run_study(StudyConfig(**kw, needle_draw="per-depth"), **quiet)
    recs = [json.loads(x) for x in (out / "passkey.jsonl").read_text().splitlines()]
    assert len({tuple(r["answers"]) for r in recs}) == 4
    summary = (out / "summary.md").read_text()
    assert "a length's 4 answers hold 4 independent needles" in summary
    assert json.loads((out / "config.json").read_text())["config"]["needle_draw"] == "per-depth"
    with pytest.raises(ValueError, match="--needle-draw per-depth; these settings ask --needle-draw shared"):
        run_study(StudyConfig(**kw, resume=True), **quiet)
    # a folder from before the setting was recorded drew shared needles
    doc = json.loads((out / "config.json").read_text())
    del doc["config"]["needle_draw"]
    (out / "config.json").write_text(json.dumps(doc))
    with pytest.raises(ValueError, match="asks its needles with --needle-draw shared"):
        run_study(StudyConfig(**kw, needle_draw="per-depth", resume=True), **quiet)


def test_study_shared_needles_say_how_many_are_independent(tmp_path, fake_train):
    from posbias.study.runner import StudyConfig, run_study

    train, _ = fake_train
    run_study(StudyConfig(out=str(tmp_path / "s"), schemes="nope", train_steps=2, train_context=160, multipliers=[1],
                          depths=[0.0, 0.5, 1.0], n=2, ppl_multipliers=[], modes=["teacher_forced"]),
              train_fn=train, progress=False, log=lambda *a: None)
    assert ("The same 2 needles are asked at every depth (`--needle-draw shared`, a paired design): a length's 6 "
            "answers hold 2 independent needles") in (tmp_path / "s" / "summary.md").read_text()
    with pytest.raises(ValueError, match="needle draw 'x' is not one of"):
        StudyConfig(out=str(tmp_path / "t"), needle_draw="x")


def test_one_mode_spelling_with_the_old_one_accepted():
    from posbias.evaluation.modes import canonical_mode
    from posbias.study.runner import StudyConfig

    assert StudyConfig(out="x", modes=["teacher_forced", "generate"]).modes == ["teacher-forced", "generate"]
    assert StudyConfig(out="x").modes == ["teacher-forced", "generate"]
    assert canonical_mode("tf") == "teacher-forced" and canonical_mode("bogus") == "bogus"


def test_two_study_invocations_training_at_once_keep_each_others_models(tmp_path, monkeypatch):
    """models.json is re-read before each entry is added: an invocation that read it before another
    one recorded its model (two `posbias study --schemes X` on one folder at once) does not drop it."""
    import posbias.study.training as training
    from posbias.study.runner import StudyConfig, ensure_models

    monkeypatch.setattr(training, "_train_config_class", lambda: None)
    out = tmp_path / "s"

    def train_rope_meanwhile(config):  # while alibi trains, another invocation records rope
        ensure_models(StudyConfig(out=str(out), schemes="rope", train_steps=2, train_context=160),
                      train_fn=_picklable_fake_train, log=lambda *a: None)
        return _picklable_fake_train(config)

    ensure_models(StudyConfig(out=str(out), schemes="alibi", train_steps=2, train_context=160),
                  train_fn=train_rope_meanwhile, log=lambda *a: None)
    assert set(json.loads((out / "models.json").read_text())) == {"rope", "alibi"}


def test_study_passkey_in_the_heldout_text_added_on_resume(tmp_path, fake_train, tiny_tokenizer):
    """--passkey-heldout, added to a finished study: a third passkey view whose filler is the held-out
    split's sentences (text no scheme trained on), the same keys; nothing retrained. Without held-out
    text (no --heldout, no perplexity, no earlier split) it is refused before anything runs."""
    from posbias.study.runner import StudyConfig, run_study
    from posbias.tasks.haystack import split_sentences

    train, calls = fake_train
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"text": f"Document {i} is about topic {i}. It has a second line {i}. " * 6})
                              + "\n" for i in range(40)))
    kw = dict(out=str(tmp_path / "study"), preset="tiny", schemes="alibi", train_steps=3, train_context=160,
              multipliers=[1], depths=[0.5], n=2, seed=0, corpus=str(corpus), ppl_multipliers=[1], ppl_tokens=400)
    run_study(StudyConfig(**kw), train_fn=train, progress=False, log=lambda *a: None)
    run_study(StudyConfig(**kw, passkey_heldout=True, resume=True), train_fn=train, progress=False,
              log=lambda *a: None)
    assert len(calls) == 1
    out = tmp_path / "study"
    held = {s for x in (out / "data" / "heldout.jsonl").read_text().splitlines()
            for s in split_sentences(json.loads(x)["text"])}
    trained = {s for x in (out / "data" / "train.jsonl").read_text().splitlines()
               for s in split_sentences(json.loads(x)["text"])}
    pk = [json.loads(x) for x in (out / "passkey.jsonl").read_text().splitlines()]
    mine = [json.loads(x) for x in (out / "passkey-heldout.jsonl").read_text().splitlines()]
    assert [r["answers"] for r in mine] == [r["answers"] for r in pk] and len(mine) == 2
    from posbias.tasks import make_instances

    inst = make_instances("passkey", tokenizer=tiny_tokenizer, n=1, depths=[0.5], seed=0, length=160,
                          haystack=str(out / "data" / "heldout.jsonl"))[0]
    filler = [s for s in split_sentences(inst.prompt.split("\n")[1]) if "pass key" not in s and "Remember" not in s]
    assert filler and set(filler) <= held and not set(filler) & trained
    assert "passkey-heldout" in (out / "summary.md").read_text()
    before = (out / "passkey-heldout.jsonl").read_text()
    run_study(StudyConfig(**{**kw, "ppl_multipliers": []}, passkey_heldout=True, resume=True), train_fn=train,
              progress=False, log=lambda *a: None)  # no perplexity now: the folder's split still serves
    assert (out / "passkey-heldout.jsonl").read_text() == before and len(calls) == 1
    with pytest.raises(ValueError, match="passkey_heldout.*--heldout or keep --ppl-multipliers"):
        StudyConfig(**{**kw, "out": str(tmp_path / "other"), "ppl_multipliers": []}, passkey_heldout=True)


def test_resume_may_add_perplexity_contexts_on_the_same_tokens(tmp_path, fake_train):
    """--ppl-multipliers may grow on resume (only the new contexts are measured) while perplexity stays
    on the same held-out tokens; a change of those tokens is refused, naming the --ppl-tokens to pass."""
    from posbias.study.runner import StudyConfig, run_study

    train, calls = fake_train
    out = tmp_path / "study"
    kw = dict(out=str(out), preset="tiny", schemes="alibi", train_steps=3, train_context=160, multipliers=[1],
              depths=[0.5], n=1, seed=0, corpus=_corpus(tmp_path), ppl_multipliers=[1], ppl_tokens=400)
    run = lambda **o: run_study(StudyConfig(**{**kw, **o}, resume=True), train_fn=train, progress=False,  # noqa: E731
                                log=lambda *a: None)
    run()
    first = (out / "perplexity.jsonl").read_text().splitlines()
    run(ppl_multipliers=[1, 2])
    ppl = [json.loads(x) for x in (out / "perplexity.jsonl").read_text().splitlines()]
    assert (out / "perplexity.jsonl").read_text().splitlines()[:len(first)] == first and len(calls) == 1
    assert {(r["context"], r["eval_tokens"]) for r in ppl} == {(160, 400), (320, 400)}
    with pytest.raises(ValueError, match="measured perplexity on 400 held-out tokens.*--ppl-tokens 400"):
        run(ppl_tokens=None, ppl_multipliers=[1, 2])  # 4 x 320 = 1280 tokens
    with pytest.raises(ValueError, match="measured perplexity on 400 held-out tokens.*--ppl-tokens 400"):
        run(ppl_tokens=800)
    # an invocation without perplexity (far cells only) resumes too: same split, nothing measured, and the
    # folder keeps its held-out size, so the next one with perplexity resumes as well
    split = (out / "data" / "train.jsonl").read_text()
    before = (out / "perplexity.jsonl").read_text()
    run(ppl_multipliers=[], ppl_tokens=None, multipliers=[1, 2])
    assert json.loads((out / "config.json").read_text())["config"]["ppl_eval_tokens"] == 400
    assert (out / "data" / "train.jsonl").read_text() == split and (out / "perplexity.jsonl").read_text() == before
    assert {r["length"] for r in map(json.loads, (out / "passkey.jsonl").read_text().splitlines())} == {160, 320}
    run(ppl_multipliers=[1, 2])
    assert len(calls) == 1
    other = tmp_path / "no-ppl"
    run(out=str(other), ppl_multipliers=[])
    with pytest.raises(ValueError, match="measured perplexity on None .*trained on the whole corpus"):
        run(out=str(other), ppl_multipliers=[1])


def test_evaluation_only_change_keeps_unfinished_training_and_training_change_says_it_discards(tmp_path, fake_train):
    """A study killed while training, re-run with other evaluation settings (depths, perplexity tokens, a
    logging option), resumes its partial training; other training settings discard it, in one line."""
    from posbias.study.runner import StudyConfig, run_study

    train, calls = fake_train
    out = tmp_path / "study"
    kw = dict(out=str(out), schemes="rope", train_steps=3, train_context=160, multipliers=[1], depths=[0.5], n=1,
              corpus=_corpus(tmp_path), heldout=_corpus(tmp_path), ppl_multipliers=[1], ppl_tokens=400)

    def killed(config):  # the trainer wrote its first checkpoint, then the study was killed
        Path(config["out"]).mkdir(parents=True, exist_ok=True)
        (Path(config["out"]) / "checkpoint.pt").write_text("step 2")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_study(StudyConfig(**kw), train_fn=killed, progress=False, log=lambda *a: None)
    lines = []
    changed = {"depths": [0.0, 1.0], "ppl_tokens": 300, "train_options": {"log_every": 1}}
    run_study(StudyConfig(**{**kw, **changed}, resume=True), train_fn=train, progress=False, log=lines.append)
    assert calls[-1]["resume"] is True and calls[-1]["log_every"] == 1  # the partial training was kept
    assert not [x for x in lines if "removed" in x]

    kw["out"] = str(out := tmp_path / "study2")
    with pytest.raises(KeyboardInterrupt):
        run_study(StudyConfig(**kw), train_fn=killed, progress=False, log=lambda *a: None)
    lines.clear()
    run_study(StudyConfig(**{**kw, "train_steps": 4}, resume=True), train_fn=train, progress=False, log=lines.append)
    said = [x for x in lines if "removed" in x]
    assert len(said) == 1 and "train_steps: 3 -> 4" in said[0] and "models/" in said[0]
    assert calls[-1]["resume"] is False and calls[-1]["steps"] == 4


def test_a_study_folder_that_recorded_probe_tasks_as_text_still_resumes(tmp_path):
    """Run folders written before the typed options recorded ``--train-opt probe_tasks=passkey,niah`` as
    the string; the same command now gives a list, and the folder still resumes."""
    from posbias.cli.common import check_training_run
    from posbias.study.config import CHECK_KEYS, StudyConfig, upgrade_settings
    from posbias.study.runner import study_settings

    cfg = StudyConfig(out=str(tmp_path / "s"), schemes="rope", train_options={"probe_tasks": ("passkey", "niah")})
    settings = study_settings(cfg)
    assert settings["train_options"] == {"probe_tasks": ["passkey", "niah"]}
    (tmp_path / "s").mkdir()
    old = {**json.loads(json.dumps(settings)), "train_options": {"probe_tasks": "passkey,niah"}}
    (tmp_path / "s" / "config.json").write_text(json.dumps({"kind": "study", "config": old, "versions": {}}))
    assert check_training_run(cfg, "study", settings, CHECK_KEYS, upgrade=upgrade_settings)
    other = StudyConfig(out=str(tmp_path / "s"), schemes="rope", train_options={"probe_tasks": "passkey"})
    with pytest.raises(ValueError, match="train_options.probe_tasks"):
        check_training_run(other, "study", study_settings(other), CHECK_KEYS, upgrade=upgrade_settings)


def test_study_trains_and_scores_the_kerple_and_fire_priors(tmp_path, tiny_tokenizer):
    """``--schemes kerple-log,kerple-power+ssmax,fire``: each scheme trains (the real trainer, a few steps of a
    tiny model) and is scored on the grid."""
    from typer.testing import CliRunner

    from posbias.cli.main import app
    from posbias.study.grid import parse_schemes
    from posbias.study.training import model_dir_name

    assert parse_schemes("kerple-log,kerple-power+ssmax,fire") == ["kerple-log", "kerple-power+ssmax", "fire"]
    tok = tmp_path / "tok"
    tiny_tokenizer.save_pretrained(tok)
    out = tmp_path / "s"
    args = ["study", "--out", str(out), "--schemes", "kerple-log,kerple-power+ssmax,fire", "--train-steps", "3",
            "--train-context", "160", "--multipliers", "1,2", "--depths", "0.5", "--n", "1", "--ppl-multipliers", "",
            "--modes", "teacher-forced", "--corpus", _corpus(tmp_path), "--tokenizer", str(tok), "--passkey-rate", "0",
            "--train-opt", "batch_size=2", "--model-opt", "num_hidden_layers=1", "--model-opt", "hidden_size=32",
            "--model-opt", "intermediate_size=64", "--model-opt", "fire_threshold=64"]
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 0, r.output
    rows = [json.loads(x) for x in (out / "passkey.jsonl").read_text().splitlines()]
    assert sorted({r["model"] for r in rows}) == ["fire", "kerple-log", "kerple-power+ssmax"] and len(rows) == 6
    for scheme, pe in (("kerple-log", "kerple-log"), ("kerple-power+ssmax", "kerple-power"), ("fire", "fire")):
        folder = out / "models" / model_dir_name(scheme)
        steps = [json.loads(x) for x in (folder / "metrics.jsonl").read_text().splitlines() if '"loss"' in x]
        assert steps and json.loads((folder / "final" / "config.json").read_text())["pe"] == pe
        curves = json.loads((out / "priors" / f"{model_dir_name(scheme)}-curves.json").read_text())
        assert set(curves) == {"query_at_160", "query_at_320"} and len(curves["query_at_320"]) == 4  # 1 layer x 4 heads
        assert curves["query_at_320"][0]["distances"][-1] == 320


def test_prior_curves_of_every_learnable_prior():
    """prior_curves reads each layer's prior at given distances: KERPLE as its formula with its r1 / r2, FIRE at
    the asked query position, a shared prior with layer None, and nothing for RoPE."""
    from posbias.study.priors import prior_curves

    kerple = tiny_bam("kerple-log", "softmax")
    curves = prior_curves(kerple, [0, 1, 10, 100])
    assert len(curves) == kerple.config.num_hidden_layers * kerple.config.num_attention_heads
    c = curves[5]
    r1, r2 = c["params"]["r1"], c["params"]["r2"]
    assert c["layer"] == 5 // kerple.config.num_attention_heads
    assert c["bias"] == pytest.approx([-r1 * math.log1p(r2 * x) for x in (0, 1, 10, 100)], rel=1e-5)
    fire = tiny_bam("fire", "softmax")
    far = prior_curves(fire, [0, 5, 50], query_position=5000)
    prior = fire.model.priors[0]
    ref = prior(torch.tensor([5000]), torch.tensor([5000, 4995, 4950]))[:, 0]
    assert far[0]["query_position"] == 5000 and far[1]["bias"] == pytest.approx(ref[1].tolist(), rel=1e-5)
    shared = tiny_bam("kerple-power", "softmax", ggd_share_layers=True)
    assert {c["layer"] for c in prior_curves(shared, [1, 2])} == {None}
    assert prior_curves(tiny_bam("rope", "softmax"), [1, 2]) == []
    with pytest.raises(ValueError, match="distances must lie in"):
        prior_curves(fire, [10], query_position=5)


def test_serial_training_names_each_scheme_as_it_starts(tmp_path, fake_train):
    from posbias.study.runner import StudyConfig, ensure_models

    train, calls = fake_train
    said = []

    def logged_train(config):
        said.append(f"trained {config['pe']}")
        return train(config)

    cfg = StudyConfig(out=str(tmp_path / "s"), schemes="rope,alibi", train_steps=2, train_context=160)
    ensure_models(cfg, train_fn=logged_train, log=said.append)
    starts = [line for line in said if line.startswith("[study] training") or line.startswith("trained ")]
    assert starts[0].startswith("[study] training rope (1 of 2) -> ") and starts[1] == "trained rope"
    assert starts[2].startswith("[study] training alibi (2 of 2) -> ") and starts[3] == "trained alibi"
