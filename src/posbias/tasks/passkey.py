"""Passkey retrieval in the Landmark-attention format, fitted to a token length.

Two prompt protocols (task option ``protocol``):

* ``posbias`` (default): intro, filler and question on their own lines; the answer scored is
  ``" <key>"``, the space before the key included (the format the study's models train on).
* ``bam``: the BAM reference's evaluator (Bianchessi et al. 2025, ``eval_utils.PromptGenerator``):
  its intro ("... memorize them. ..."), the pieces joined by single spaces, the question
  "What is the pass key? The pass key is" and the space before the key given, so only the digits
  are scored (teacher forced: the argmax must equal every digit).

``given_digits = g`` gives the first ``g`` digits of a ``digits + g``-digit key after the answer prefix
and scores the remaining ``digits`` (the reference's ``passkey_preffix_digits``, whose keys have
``pred_digits + preffix_digits`` digits). The reference's long-range setting is ``protocol=bam``,
depth 0 (``sampling='beginning'``), ``n = 10``, with ``given_digits`` 0 or 1 (docs/methods/bam.md).
"""
from __future__ import annotations

from posbias.tasks.base import MAX_LENGTH, Instance, check_int, depth_to_index, derive_rng, instance_id, realised_depth
from posbias.tasks.chat import apply_chat, prompt_tokens
from posbias.tasks.fitting import fit_units
from posbias.tasks.haystack import haystack_units
from posbias.tasks.kv import random_numbers
from posbias.tasks.niah import NEEDLE

PASSKEY_INTRO = ("There is an important info hidden inside a lot of irrelevant text. Find it and "
                 "memorize it. I will quiz you about the important information there.")
BAM_INTRO = ("There is an important info hidden inside a lot of irrelevant text. Find it and "
             "memorize them. I will quiz you about the important information there.")  # the BAM reference's wording
PASSKEY_QUESTION = "What is the pass key?"
PASSKEY_PREFIX = "The pass key is"
PROTOCOLS = ("posbias", "bam")


def passkey_prompt(key: str, units: int, position: int, haystack: str = "noise", protocol: str = "posbias") -> str:
    """Intro, ``units`` filler units with the key sentence after ``position`` of them, question. The
    filler is the grass/sky ``noise`` sentence group repeated (the Landmark-attention format), the
    first ``units`` sentences of the Paul Graham ``essay`` haystack (a filler a model trained on the
    noise never saw) or of a corpus file / folder given as ``haystack``
    (:func:`posbias.tasks.haystack.haystack_units`); ``protocol`` as in the module docstring."""
    return passkey_prompt_in(key, haystack_units(haystack)(units), position, protocol)


def passkey_prompt_in(key: str, filler: list[str], position: int, protocol: str = "posbias") -> str:
    """The passkey prompt with the given filler units (sentences), the key sentence after ``position`` of them."""
    hay = list(filler)
    hay.insert(position, f"The pass key is {key}. Remember it. {key} is the pass key.")
    if protocol == "bam":
        return " ".join([BAM_INTRO, *hay, PASSKEY_QUESTION])
    return f"{PASSKEY_INTRO}\n{' '.join(hay)}\n{PASSKEY_QUESTION}"


def answer_prefix(key: str, protocol: str = "posbias", given_digits: int = 0) -> str:
    """What follows the question before the scored digits: ``"The pass key is"`` (posbias; the answer
    ``" <key>"`` brings its space), ``"The pass key is "`` (bam: the space given), or with ``given_digits``
    ``"The pass key is <first digits>"`` (the rest of the key joins it without a space)."""
    if given_digits:
        return f"{PASSKEY_PREFIX} {key[:given_digits]}"
    return PASSKEY_PREFIX + (" " if protocol == "bam" else "")


def passkey_document(key: str, units: int, position: int, filler: list[str] | None = None) -> str:
    """A passkey *training* document: the evaluation prompt (:func:`passkey_prompt`, raw format;
    with ``filler``, those units instead of ``units`` noise units) followed by its answer, so
    training and evaluation see the same wording."""
    prompt = passkey_prompt(key, units, position) if filler is None else passkey_prompt_in(key, filler, position)
    return f"{prompt} {PASSKEY_PREFIX} {key}."


def task_vocabulary_texts(copies: int = 200) -> list[str]:
    """Text of the synthetic tasks (a passkey document, a RULER needle), repeated so that a tokenizer
    trained with it makes their words single tokens (``posbias.training.tokenizer``)."""

    return [passkey_document("12345", 4, 2), NEEDLE.format(key="example-key", value="1234567")] * copies


def make_passkey(*, tokenizer=None, n, depths, seed, split, length=1024, digits=5,
                 haystack: str = "noise", protocol: str = "posbias", given_digits: int = 0) -> list[Instance]:
    """Filler units ``F`` fitted per instance so that ``apply_chat(prompt, prefix)`` <= ``length``
    tokens at every depth; the key goes after ``round(depth * F)`` units (``num_items = F + 1``).
    The question ends with ``"What is the pass key?"`` and ``answer_prefix = "The pass key is"``
    (raw concatenation gives the original ``"What is the pass key? The pass key is"``). ``haystack``:
    ``noise``, ``essay`` or the path of a text corpus (:func:`passkey_prompt`). ``protocol`` and
    ``given_digits`` (keys of ``digits + given_digits`` digits, the first ones given, the last ``digits``
    scored): see the module docstring."""
    task = "passkey"
    length = check_int("length", length, maximum=MAX_LENGTH)
    digits = check_int("digits", digits, maximum=18)
    given_digits = check_int("given_digits", given_digits, minimum=0, maximum=18 - digits)
    if protocol not in PROTOCOLS:
        raise ValueError(f"unknown passkey protocol {protocol!r}; known: {', '.join(PROTOCOLS)}")
    haystack_units(haystack)  # a bad haystack fails here, before any fitting
    keys = [random_numbers(derive_rng(task, split, seed, i), 1, digits + given_digits)[0] for i in range(n)]

    def tokens(key: str, units: int, depth: float) -> int:
        pos = depth_to_index(depth, units + 1)
        return prompt_tokens(tokenizer, apply_chat(tokenizer, passkey_prompt(key, units, pos, haystack, protocol),
                                                   answer_prefix(key, protocol, given_digits)))

    fitted = []
    for key in keys:
        units = fit_units(lambda u, key=key: tokens(key, u, 0.5), length, what="the passkey prompt")
        while units > 0 and max(tokens(key, units, d) for d in depths) > length:
            units -= 1
        fitted.append(units)
    out = []
    for depth in depths:
        for i, (key, units) in enumerate(zip(keys, fitted)):
            pos = depth_to_index(depth, units + 1)
            prompt = passkey_prompt(key, units, pos, haystack, protocol)
            prefix = answer_prefix(key, protocol, given_digits)
            extra = {"protocol": protocol} if protocol != "posbias" else {}
            if given_digits:  # the scored digits continue the given ones without a space
                extra.update(given_digits=given_digits, key=key, answer_joined=True)
            out.append(Instance(
                id=instance_id(task, split, seed, depth, i), task=task, prompt=prompt, answers=[key[given_digits:]],
                gold_index=pos, num_items=units + 1, depth=float(depth), metric="passkey",
                answer_prefix=prefix,
                meta={"filler_units": units, "length": length, "haystack": haystack,
                      "prompt_tokens": prompt_tokens(tokenizer, apply_chat(tokenizer, prompt, prefix)),
                      "realised_depth": realised_depth(pos, units + 1), **extra},
            ))
    return out
