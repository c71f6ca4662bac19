"""Teacher-forced scoring and greedy generation agree, batched or not, on tiny random models."""
import pytest
import torch
from conftest import make_tiny_model

from posbias.evaluation.batching import Encoded, left_pad
from posbias.evaluation.generation import greedy_batch, greedy_generate
from posbias.evaluation.teacher_forced import score_batch, score_teacher_forced
from posbias.tasks.base import Instance


def _inst(i, prompt, answer):
    return Instance(id=f"t{i}", task="toy", prompt=prompt, answers=[answer], gold_index=0, num_items=1,
                    depth=0.0, metric="substring")


PROMPTS = ["The grass is green. The sky is", "Here we go. There and back again. The pass key is",
           "Extract the value", "The sun is yellow. Question: who wrote the document? Answer:"]


def test_left_padding_keeps_positions():
    ids, mask, pos = left_pad([[5, 6, 7], [8]], pad_id=0)
    assert ids.tolist() == [[5, 6, 7], [0, 0, 8]]
    assert mask.tolist() == [[1, 1, 1], [0, 0, 1]]
    assert pos[1, -1].item() == 0 and pos[0].tolist() == [0, 1, 2]


def test_teacher_forced_em_equals_greedy_em(tiny_tokenizer):
    model = make_tiny_model("llama", seed=3)
    prompts = [tiny_tokenizer(p)["input_ids"] for p in PROMPTS]
    greedy = [greedy_batch(model, [p], 0, set(), 4)[0] for p in prompts]
    batch, expected = [], []
    for p, g in zip(prompts, greedy):
        wrong = g[:-1] + [(g[-1] + 1) % 400]
        for answer, is_greedy in ((g, True), (wrong, False)):
            batch.append(Encoded(_inst(len(batch), "", ""), p, answer))
            expected.append(is_greedy)
    got = [r["em"] for r in score_batch(model, batch, pad_id=0)]
    assert got == expected


def test_batched_scores_equal_single(tiny_tokenizer):
    model = make_tiny_model("qwen2", seed=1)
    insts = [_inst(i, p, "green") for i, p in enumerate(PROMPTS)]
    one = score_teacher_forced(model, tiny_tokenizer, insts, batch_size=1)
    many = score_teacher_forced(model, tiny_tokenizer, insts, batch_size=4)
    assert [r["id"] for r in many] == [i.id for i in insts]
    for a, b in zip(one, many):
        assert a["em"] == b["em"]
        assert abs(a["logprob"] - b["logprob"]) < 1e-4


def test_batched_generation_equals_single(tiny_tokenizer):
    model = make_tiny_model("mistral", seed=2)
    insts = [_inst(i, p, "x") for i, p in enumerate(PROMPTS)]
    single = [greedy_generate(model, tiny_tokenizer, [i], max_new_tokens=5)[0] for i in insts]
    batched = greedy_generate(model, tiny_tokenizer, insts, max_new_tokens=5, batch_size=4)
    assert single == batched


def test_cached_generation_equals_full_recompute(tiny_tokenizer):
    model = make_tiny_model("llama", seed=4)
    p = tiny_tokenizer(PROMPTS[1])["input_ids"]
    cached = greedy_batch(model, [p], 0, set(), 6)[0]
    seq = list(p)
    for _ in range(6):
        with torch.no_grad():
            seq.append(int(model(torch.tensor([seq])).logits[0, -1].argmax()))
    assert cached == seq[len(p):]


def test_context_too_long_is_a_clear_error(tiny_tokenizer):
    import pytest

    from posbias.evaluation.batching import ContextTooLongError

    model = make_tiny_model("llama", max_positions=16)
    with pytest.raises(ContextTooLongError, match="maximum of 16 positions"):
        score_teacher_forced(model, tiny_tokenizer, [_inst(0, PROMPTS[0] * 10, "x")])


def _greedy_form(model, tokenizer, inst) -> str:
    """The model's own greedy continuation of ``inst`` (3, 2 or 1 tokens) as text that tokenises back to
    the same ids (a random model's tokens often do not)."""
    from posbias.evaluation.batching import encode

    prompt = encode(tokenizer, inst, False).prompt_ids
    for tokens in (3, 2, 1):
        ids = greedy_batch(model, [prompt], 0, set(), tokens)[0]
        text = tokenizer.decode(ids)
        if tokenizer(text, add_special_tokens=False)["input_ids"] == ids and "<" not in text:
            return text
    pytest.fail(f"no greedy continuation of {inst.prompt!r} tokenises back to itself")


def test_an_accepted_form_counts_where_the_target_fails(tiny_tokenizer, monkeypatch):
    """An instance whose first target is not matched is scored again on its other accepted forms: the
    model's own continuation counts as exact match (named in em_form), a wrong form does not, the
    log-prob stays the first target's, and a matched first target scores no alternative."""
    import posbias.evaluation.teacher_forced as tf
    from posbias.evaluation.generation import score_shared_prefill

    model = make_tiny_model("llama", seed=3)
    base = [_inst(i, p, "zzz") for i, p in enumerate(PROMPTS[:3])]
    plain = score_teacher_forced(model, tiny_tokenizer, base)
    assert not any(r["em"] for r in plain)
    own = _greedy_form(model, tiny_tokenizer, base[2])
    base[2].meta["tf_alternatives"] = ["qqq", own]  # the second form is the model's own
    base[1].meta["tf_alternatives"] = ["qqq"]  # a form the model does not write
    got = score_teacher_forced(model, tiny_tokenizer, base, batch_size=2)
    assert [r["em"] for r in got] == [False, False, True] and got[2]["em_form"] == own
    assert "em_form" not in got[1] and [r["logprob"] for r in got] == [r["logprob"] for r in plain]
    both = score_shared_prefill(model, tiny_tokenizer, base[2], chat=False, max_new_tokens=3)
    assert both["tf_em"] and both["tf_em_form"] == own and both["prediction"].startswith(own)

    matched = _inst(9, PROMPTS[2], own)
    matched.meta.update(tf_alternatives=["qqq"], answer_joined=True)
    monkeypatch.setattr(tf, "alternative_instances", lambda inst: pytest.fail("a matched target was retried"))
    assert tf.score_teacher_forced(model, tiny_tokenizer, [matched])[0]["em"]


def test_shared_context_questions_accept_the_forms_too(tiny_tokenizer, monkeypatch):
    """The alternatives of a shared context's questions are scored against that context's prefill too."""
    import posbias.evaluation.teacher_forced as tf
    from posbias.evaluation.teacher_forced import score_instances

    model = make_tiny_model("llama", seed=3)
    context = "The grass is green. "
    questions = [_inst(i, context + q, "zzz") for i, q in enumerate(["The sky is", "Extract the value"])]
    for q in questions:
        q.meta.update(context_id="c0", context_chars=len(context))
    questions[1].meta["tf_alternatives"] = [_greedy_form(model, tiny_tokenizer, questions[1])]
    monkeypatch.setattr(tf, "score_teacher_forced", lambda *a, **k: pytest.fail("scored one prompt per question"))
    got = score_instances(model, tiny_tokenizer, questions)
    assert [r["em"] for r in got] == [False, True] and got[1]["em_form"] == questions[1].meta["tf_alternatives"][0]


def test_a_form_the_model_does_not_start_is_not_scored(tiny_tokenizer):
    """Only forms whose first token is the model's own first answer token get a second pass."""
    from posbias.evaluation.teacher_forced import accept_alternatives, first_token_of

    model = make_tiny_model("llama", seed=3)
    inst = _inst(0, PROMPTS[2], "zzz")
    own = _greedy_form(model, tiny_tokenizer, inst)
    other = next(w for w in ("qqq", "The", "green") if first_token_of(tiny_tokenizer, w) != first_token_of(
        tiny_tokenizer, own))
    inst.meta["tf_alternatives"] = [other, own]
    record = score_teacher_forced(model, tiny_tokenizer, [_inst(0, PROMPTS[2], "zzz")])[0]
    assert record["first_token"] == first_token_of(tiny_tokenizer, own)
    scored = []

    def scorer(alts):
        scored.extend(a.meta["tf_target"] for a in alts)
        return score_teacher_forced(model, tiny_tokenizer, alts)

    got = accept_alternatives(model, tiny_tokenizer, [inst], [record], batch_size=4, chat=False, scorer=scorer)
    assert scored == [own] and got[0]["em"] and got[0]["em_form"] == own
