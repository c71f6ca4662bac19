"""One prefill, many answers: scoring through a KV cache equals scoring each prompt in one pass."""
from __future__ import annotations

import pytest
import torch
from conftest import make_tiny_model

from posbias.evaluation.batching import Encoded
from posbias.evaluation.scoring import Continuation, prompt_dependent, score_shared_context, score_via_cache
from posbias.evaluation.teacher_forced import score_batch
from posbias.methods import apply_method
from posbias.tasks.base import Instance

PAD = 0
METHODS = {
    "none": {},
    "pi": {"factor": 1.6},
    "attention-buckets": {"multipliers": [1.0, 2.0]},
    "moice": {"top_k": 7},  # dense; with top-k < experts a near-tie in routing can flip between paths
    "ms-poe-index": {"order": "index"},
}


def _apply(model, name, tmp_path=None):
    if name == "lpes":
        from posbias.patching.rope_scaling import save_factors_file

        path = tmp_path / "f.json"
        save_factors_file(path, factors=[0.7, 1.0, 1.9])
        return apply_method(model, "lpes", factors=str(path))
    if name == "ms-poe-index":
        return apply_method(model, "ms-poe", **METHODS[name])
    return apply_method(model, name, **METHODS[name])


def _inst(i):
    return Instance(id=f"q{i}", task="t", prompt="", answers=["x"], gold_index=0, num_items=1, depth=0.0,
                    metric="substring")


def _rows(seed, n, lo=3, hi=500):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(lo, hi, (int(torch.randint(1, 5, (1,), generator=g)),), generator=g).tolist()
            for _ in range(n)]


def _close(a, b):
    assert [r["id"] for r in a] == [r["id"] for r in b]
    assert [r["em"] for r in a] == [r["em"] for r in b]
    assert [r["hits"] for r in a] == [r["hits"] for r in b]
    for x, y in zip(a, b):
        assert x["n_tokens"] == y["n_tokens"] and x["prompt_tokens"] == y["prompt_tokens"]
        assert abs(x["logprob"] - y["logprob"]) < 1e-4, (x, y)


@pytest.mark.filterwarnings("ignore:moice")
@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("name", [*METHODS, "lpes"])
def test_shared_context_equals_one_prompt_per_question(arch, name, tmp_path):
    model = make_tiny_model(arch)
    context = torch.randint(3, 500, (17,), generator=torch.Generator().manual_seed(1)).tolist()
    questions, answers = _rows(2, 5), _rows(3, 5)
    items = [Continuation(f"q{i}", q + a, len(a), len(context) + len(q))
             for i, (q, a) in enumerate(zip(questions, answers))]
    with _apply(model, name, tmp_path) as h:
        shared = score_shared_context(h.model, context, items, PAD, batch_size=2)
        single = score_batch(h.model, [Encoded(_inst(i), context + q, a)
                                       for i, (q, a) in enumerate(zip(questions, answers))], PAD)
    assert h.shared_prefill
    _close(shared, single)


@pytest.mark.parametrize("name", ["none", "pi", "lpes"])
def test_prompt_then_answer_through_the_cache_equals_one_pass(name, tmp_path):
    model = make_tiny_model("mistral")
    prompts, answers = _rows(4, 4), _rows(5, 4)
    prompts = [p * 3 for p in prompts]  # different prompt lengths: left padding in the prefill
    batch = [Encoded(_inst(i), p, a) for i, (p, a) in enumerate(zip(prompts, answers))]
    with _apply(model, name, tmp_path) as h:
        _close(score_via_cache(h.model, batch, PAD), score_batch(h.model, batch, PAD))


def test_ms_poe_score_order_comes_from_the_prompt_alone():
    """The head order of the prompt is the same whatever the gold answer (no leak), and teacher
    forcing equals prefilling the prompt then feeding the answer (what generation sees)."""
    model = make_tiny_model("llama")
    prompt = torch.randint(3, 500, (15,), generator=torch.Generator().manual_seed(7)).tolist()
    with apply_method(model, "ms-poe", skip_layers=0) as h:
        assert not h.shared_prefill
        state = h.state["ms_poe"]
        ratios = []
        for answer in ([5, 6, 7], [300, 301, 302, 303]):
            score_batch(h.model, [Encoded(_inst(0), prompt, answer)], PAD)
            ratios.append([state.head_ratios(i).clone() for i in range(3)])
        assert all(torch.equal(a, b) for a, b in zip(*ratios))
        ref = score_via_cache(h.model, [Encoded(_inst(0), prompt, [5, 6, 7])], PAD)
        got = score_batch(h.model, [Encoded(_inst(0), prompt, [5, 6, 7])], PAD)
    _close(got, ref)
    assert not prompt_dependent(model)  # remove() clears the mark


@pytest.mark.parametrize("name", ["none", "lpes"])
def test_kv_shared_contexts_score_like_their_own_prompts(name, tiny_tokenizer, tmp_path):
    from posbias.evaluation.teacher_forced import score_instances
    from posbias.tasks.kv import make_kv

    model = make_tiny_model("qwen2")
    insts = make_kv(n=3, depths=[0.0, 0.5, 1.0], seed=0, split="search", num_keys=6, shared_context=True)
    assert len({i.meta["context_id"] for i in insts}) == 3
    assert all(i.prompt[: i.meta["context_chars"]] == j.prompt[: j.meta["context_chars"]]
               for i in insts for j in insts if i.meta["context_id"] == j.meta["context_id"])
    calls = []
    hook = model.register_forward_hook(lambda *a: calls.append(1))
    with _apply(model, name, tmp_path) as h:
        shared = score_instances(h.model, tiny_tokenizer, insts, batch_size=4)
        n_shared = len(calls)
        single = score_instances(h.model, tiny_tokenizer, insts, batch_size=4, shared=False)
    hook.remove()
    _close(shared, single)
    assert n_shared == 3 * 2  # per context: one prefill + one batch of its 3 questions


def test_niah_shared_contexts_score_like_their_own_prompts(tiny_tokenizer):
    from posbias.evaluation.teacher_forced import score_instances
    from posbias.tasks.niah import make_niah

    model = make_tiny_model("llama")
    insts = make_niah(tokenizer=tiny_tokenizer, n=2, depths=[0.0, 0.5, 1.0], seed=0, split="search",
                      num_needles=6, length=600, shared_context=True)
    by_ctx = {}
    for inst in insts:
        by_ctx.setdefault(inst.meta["context_id"], []).append(inst)
        assert f"for {inst.meta['keys'][0]} mentioned" in inst.prompt and inst.answers[0] in inst.prompt
    assert len(by_ctx) == 2 and all(len(v) == 3 for v in by_ctx.values())
    for members in by_ctx.values():
        ctx = {m.prompt[: m.meta["context_chars"]] for m in members}
        assert len(ctx) == 1 and len({m.answers[0] for m in members}) == 3
    _close(score_instances(model, tiny_tokenizer, insts, batch_size=4),
           score_instances(model, tiny_tokenizer, insts, batch_size=4, shared=False))
    with pytest.raises(ValueError, match="num_queries must be 1"):
        make_niah(tokenizer=tiny_tokenizer, n=1, depths=[0.5], seed=0, split="search", num_needles=6,
                  num_queries=2, length=600, shared_context=True)


@pytest.mark.smollm2
@pytest.mark.parametrize("name", ["none", "pi", "lpes"])
def test_smollm2_shared_kv_context_equals_own_prompts(smollm2, name, tmp_path):
    from posbias.evaluation.teacher_forced import score_instances
    from posbias.patching.rope_scaling import save_factors_file
    from posbias.tasks.kv import make_kv

    model, tok = smollm2
    insts = make_kv(n=2, depths=[0.0, 0.5, 1.0], seed=0, split="search", num_keys=12, shared_context=True)
    opts = {"pi": {"factor": 1.1}, "none": {}}.get(name)
    if name == "lpes":
        path = tmp_path / "f.json"
        save_factors_file(path, factors=[0.9 + 0.01 * i for i in range(30)])
        opts = {"factors": str(path)}
    with apply_method(model, name, **opts) as h:
        shared = score_instances(h.model, tok, insts, batch_size=4)
        single = score_instances(h.model, tok, insts, batch_size=2, shared=False)
    _close(shared, single)
    assert any(r["em"] for r in shared)  # the model retrieves some of them: the comparison is not vacuous


def test_hits_score_the_answer_with_its_first_tokens_given():
    """``all(hits[g:])`` of one pass = the exact match of a pass with the first ``g`` tokens in the prompt."""
    model = make_tiny_model("llama")
    prompts = _rows(6, 6, lo=3, hi=500)
    answers = []
    for p in prompts:  # greedy continuations (every hit 1), the first token then replaced: mixed hits
        ids = torch.tensor([p])
        for _ in range(4):
            ids = torch.cat([ids, model(input_ids=ids).logits[:, -1:].argmax(-1)], 1)
        greedy = ids[0, len(p):].tolist()
        answers.append([(greedy[0] + 1) % 500 + 3] + greedy[1:])
    full = score_batch(model, [Encoded(_inst(i), p, a) for i, (p, a) in enumerate(zip(prompts, answers))], PAD)
    assert any(r["hits"][1:] == [1, 1, 1] for r in full) and not any(r["em"] for r in full)  # not vacuous
    for g in (1, 2):
        given = score_batch(model, [Encoded(_inst(i), p + a[:g], a[g:])
                                    for i, (p, a) in enumerate(zip(prompts, answers))], PAD)
        assert [r["hits"][g:] for r in full] == [r["hits"] for r in given]
        assert [all(r["hits"][g:]) for r in full] == [r["em"] for r in given]
