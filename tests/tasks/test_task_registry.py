"""make_instances: validation, ordering, ids; apply_chat and prompt_tokens."""
from __future__ import annotations

import pytest

from posbias.tasks import TASKS, Instance, apply_chat, make_instances, prompt_tokens


def test_known_tasks():
    assert set(TASKS) == {"kv", "kv-uuid", "mdqa", "passkey", "niah"}


def test_unknown_task_lists_known_names():
    with pytest.raises(ValueError, match="unknown task 'nope'.*kv.*mdqa.*passkey.*niah"):
        make_instances("nope", n=1, depths=[0.0])


def test_unknown_option_names_it_and_the_valid_ones():
    with pytest.raises(ValueError, match="'num_kyes'.*num_keys.*value_digits"):
        make_instances("kv", n=1, depths=[0.0], num_kyes=3)


@pytest.mark.parametrize("depth", [-0.1, 1.5])
def test_depth_outside_range(depth):
    with pytest.raises(ValueError, match=r"depth .* outside \[0, 1\]"):
        make_instances("kv", n=1, depths=[0.0, depth])


@pytest.mark.parametrize("n", [0, -3])
def test_n_must_be_positive(n):
    with pytest.raises(ValueError, match="n must be >= 1"):
        make_instances("kv", n=n, depths=[0.0])


@pytest.mark.parametrize("kwargs,msg", [
    ({"split": "train"}, "split 'train'"),
    ({"depths": []}, "depths is empty"),
    ({"depths": [0.5, 0.5]}, "duplicates"),
    ({"seed": -1}, "seed must be >= 0"),
    ({"n": 1.5}, "n must be an integer"),
])
def test_other_bad_arguments(kwargs, msg):
    args = {"n": 1, "depths": [0.0], **kwargs}
    with pytest.raises(ValueError, match=msg):
        make_instances("kv", **args)


@pytest.mark.parametrize("name", ["passkey", "niah"])
def test_tokenizer_required(name):
    with pytest.raises(ValueError, match="needs tokenizer"):
        make_instances(name, n=1, depths=[0.0])


def test_ordering_and_ids():
    depths = [0.0, 0.5, 1.0]
    xs = make_instances("kv", n=3, depths=depths, seed=7, split="search", num_keys=5)
    assert all(isinstance(x, Instance) for x in xs)
    assert [x.depth for x in xs] == [d for d in depths for _ in range(3)]
    assert len({x.id for x in xs}) == 9
    assert xs[4].id == "kv_search_s7_d0.5_i1"
    # ids stable across calls
    assert [x.id for x in xs] == [x.id for x in make_instances("kv", n=3, depths=depths, seed=7,
                                                               split="search", num_keys=5)]


def test_apply_chat_fallback_and_template(tiny_tokenizer):
    assert apply_chat(None, "Q?") == "Q?"
    assert apply_chat(tiny_tokenizer, "Q?", "The answer is") == "Q? The answer is"
    from conftest import make_tiny_tokenizer

    tok = make_tiny_tokenizer()
    tok.chat_template = ("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}"
                         "{% if add_generation_prompt %}<assistant>{% endif %}")
    assert apply_chat(tok, "Q?", "A:") == "<user>Q?<assistant>A:"


def test_prompt_tokens(tiny_tokenizer):
    text = "The grass is green."
    assert prompt_tokens(tiny_tokenizer, text) == len(tiny_tokenizer(text, add_special_tokens=False)["input_ids"])
    assert prompt_tokens(tiny_tokenizer, text + " " + text) > prompt_tokens(tiny_tokenizer, text)


@pytest.mark.parametrize("task, options, message", [
    ("kv", {"n": 10 ** 11}, "n must be <= 100000"),
    ("kv", {"n": 10 ** 400}, "n must be <= 100000, got a number of 401 digits"),
    ("kv-uuid", {"n": 1, "num_keys": 10 ** 8}, "num_keys must be <= 100000"),
    ("passkey", {"n": 1, "length": 10 ** 11}, "length must be <= 16777216"),
    ("niah", {"n": 1, "num_needles": 10 ** 8}, "num_needles must be <= 100000"),
])
def test_counts_beyond_any_use_are_refused_before_any_work(task, options, message):
    """--n 100000000000 or --num-keys 100000000 spun and filled memory; they are one line now, at once."""
    import time

    from conftest import make_tiny_tokenizer

    start = time.perf_counter()
    n = options.pop("n")
    with pytest.raises(ValueError, match=message):
        make_instances(task, tokenizer=make_tiny_tokenizer(), n=n, depths=[0.0], **options)
    assert time.perf_counter() - start < 5
