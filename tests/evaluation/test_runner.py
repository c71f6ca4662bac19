"""The resumable evaluation loop: a run cut off part-way has scored every depth."""
import pytest
from conftest import make_tiny_model, make_tiny_tokenizer

from posbias.evaluation import runner
from posbias.evaluation.runner import depth_interleaved, evaluate
from posbias.tasks.registry import make_instances
from posbias.utils.io import read_jsonl


def _kv(n, depths):
    return make_instances("kv", n=n, depths=depths, seed=0, num_keys=4)


def test_instances_are_taken_round_robin_over_depths():
    insts = _kv(3, [0.0, 0.5, 1.0])
    assert [i.depth for i in insts] == [0.0] * 3 + [0.5] * 3 + [1.0] * 3  # the generators' order
    ordered = depth_interleaved(insts)
    assert [i.depth for i in ordered] == [0.0, 0.5, 1.0] * 3
    assert sorted(i.id for i in ordered) == sorted(i.id for i in insts)
    per_depth = [[i.id for i in ordered if i.depth == d] for d in (0.0, 0.5, 1.0)]
    assert per_depth == [[i.id for i in insts if i.depth == d] for d in (0.0, 0.5, 1.0)]  # order kept within a depth


def test_unequal_depths_keep_every_instance():
    insts = _kv(3, [0.0, 1.0])[:5]  # depth 1 has only two
    assert [i.depth for i in depth_interleaved(insts)] == [0.0, 1.0, 0.0, 1.0, 0.0]


def test_a_run_cut_off_after_one_batch_has_every_depth_and_resumes(tmp_path, monkeypatch):
    model, tok = make_tiny_model(), make_tiny_tokenizer()
    insts = _kv(4, [0.0, 0.5, 1.0])
    scored = runner.score_chunk
    calls = []

    def die_on_second_batch(*args, **kw):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return scored(*args, **kw)

    monkeypatch.setattr(runner, "score_chunk", die_on_second_batch)
    with pytest.raises(KeyboardInterrupt):
        evaluate(model, tok, insts, tmp_path, batch_size=3, progress=False)
    first = read_jsonl(tmp_path / "results.jsonl")
    assert sorted(r["depth"] for r in first) == [0.0, 0.5, 1.0]
    monkeypatch.setattr(runner, "score_chunk", scored)
    summary = evaluate(model, tok, insts, tmp_path, batch_size=3, progress=False)
    assert [r["n"] for r in summary["by_depth"]] == [4, 4, 4]
    assert read_jsonl(tmp_path / "results.jsonl")[:3] == first  # nothing scored twice


def test_records_carry_their_batch_time_and_per_token_hits(tmp_path):
    model, tok = make_tiny_model(), make_tiny_tokenizer()
    evaluate(model, tok, _kv(2, [0.0, 1.0]), tmp_path, batch_size=2, progress=False)
    records = read_jsonl(tmp_path / "results.jsonl")
    assert all(r["seconds"] > 0 for r in records)
    assert all(len(r["tf_hits"]) == r["n_tokens"] and r["tf_em"] == all(r["tf_hits"]) for r in records)


def test_generation_is_long_enough_for_the_longest_answer_by_default(tmp_path, monkeypatch):
    """Without ``max_new_tokens`` every instance may generate its longest gold answer + 4 tokens (a
    UUID answer no longer stops at a fixed 16); an explicit limit is kept, and a resumed run uses the
    limit of all its instances, not of the ones left."""
    from posbias.evaluation.generation import ANSWER_SLACK, GENERATION_FLOOR, answer_tokens, generation_budget

    tok = make_tiny_tokenizer()
    insts = make_instances("kv-uuid", n=2, depths=[0.0, 1.0], seed=0, num_keys=4)
    longest = max(answer_tokens(tok, i) for i in insts)
    assert longest > 16 and generation_budget(tok, insts) == longest + ANSWER_SLACK
    assert generation_budget(tok, insts, 5) == 5
    short = _kv(1, [0.0])  # 7-digit values keep the former fixed limit; the study's grid asks for no floor
    assert generation_budget(tok, short) == GENERATION_FLOOR == 16
    assert generation_budget(tok, short, floor=0) == answer_tokens(tok, short[0]) + ANSWER_SLACK < 16
    seen = []
    monkeypatch.setattr(runner, "greedy_generate", lambda m, t, chunk, **kw: seen.append(kw["max_new_tokens"])
                        or ["x"] * len(chunk))
    evaluate(make_tiny_model(), tok, insts, tmp_path / "a", mode="generate", batch_size=1, progress=False)
    evaluate(make_tiny_model(), tok, insts, tmp_path / "b", mode="generate", batch_size=1, max_new_tokens=7,
             progress=False)
    assert seen == [longest + ANSWER_SLACK] * 4 + [7] * 4


def test_a_shared_context_is_prefilled_once_and_scores_as_its_own_prompts(tmp_path, monkeypatch):
    """posbias eval scores the questions of a shared context (kv shared_context) from one prefill of it,
    with the scores each question gets as its own prompt."""
    from posbias.evaluation import scoring
    from posbias.evaluation.teacher_forced import score_teacher_forced

    model, tok = make_tiny_model(), make_tiny_tokenizer()
    insts = make_instances("kv", n=3, depths=[0.0, 0.5, 1.0], seed=0, num_keys=5, shared_context=True)
    prefills = []
    real = scoring.prefill
    monkeypatch.setattr(scoring, "prefill", lambda *a, **k: prefills.append(1) or real(*a, **k))
    evaluate(model, tok, insts, tmp_path, batch_size=2, progress=False)
    assert len(prefills) == 3  # one per context, whatever the batch size
    got = {r["id"]: r for r in read_jsonl(tmp_path / "results.jsonl")}
    for inst, want in zip(insts, score_teacher_forced(model, tok, insts, batch_size=1)):
        assert got[inst.id]["tf_em"] == want["em"]
        assert got[inst.id]["tf_logprob"] == pytest.approx(want["logprob"], abs=1e-4)


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_both_modes_come_from_one_prefill_per_prompt(tmp_path, monkeypatch, arch):
    """--mode both prefills each prompt once (teacher forcing through the cache, then greedy decoding from it),
    with the records of the two separate passes; the attention diagnostic is taken from that prefill."""
    from conftest import make_variant_model

    from posbias.evaluation import generation, scoring
    from posbias.evaluation.attention_probe import AttentionProbe
    from posbias.evaluation.generation import greedy_generate
    from posbias.evaluation.teacher_forced import score_teacher_forced

    model, tok = make_variant_model(arch), make_tiny_tokenizer()
    insts = _kv(2, [0.0, 1.0])
    prefills = []
    real = scoring.prefill
    for module in (scoring, generation):
        monkeypatch.setattr(module, "prefill", lambda *a, **k: prefills.append(1) or real(*a, **k))
    evaluate(model, tok, insts, tmp_path / "a", mode="both", batch_size=2, max_new_tokens=4, progress=False,
             attention=True)
    assert len(prefills) == len(insts) // 2  # one per batch of 2 (an unmatched target's other forms add one each)
    monkeypatch.undo()
    got = {r["id"]: r for r in read_jsonl(tmp_path / "a" / "results.jsonl")}
    tf = score_teacher_forced(model, tok, insts, batch_size=1)
    gen = greedy_generate(model, tok, insts, max_new_tokens=4, batch_size=1)
    for inst, t, g in zip(insts, tf, gen):
        r = got[inst.id]
        assert r["tf_em"] == t["em"] and r["tf_logprob"] == pytest.approx(t["logprob"], abs=1e-4)
        assert r["prediction"] == g and "attn_gold_rank" in r
    with AttentionProbe(model):  # the probe is gone after the run
        pass
