"""RULER-style needle-in-a-haystack with controlled needle depth, fitted to a token length.

Keys are ``word-word`` pairs from the built-in word list, values distinct 7-digit numbers. Each
of the ``num_needles`` keys has ``num_values`` needles, kept adjacent (a "group"); the first
``num_queries`` keys of the seeded order are asked, and their groups stay contiguous.

* Only asked keys (``num_needles == num_queries``, e.g. the single needle): the gold block is
  inserted after ``round(depth * U)`` of the ``U`` haystack units; ``num_items = U + 1`` and
  ``gold_index`` is that unit position (as for passkey).
* Distractor keys (``num_needles > num_queries``, e.g. 24 multi-key needles): the groups are
  spread evenly through the haystack (group ``j`` after unit ``round(j * U / (K - 1))``), the
  asked block sits at group index ``round(depth * (K - Q))``; ``num_items = K`` groups and
  ``gold_index`` is the first asked group's index. Only the gold block moves between depths.

Haystacks: ``noise`` (the grass-is-green filler), ``essay`` (Paul Graham sentences, needles at
sentence boundaries), ``needle`` (distractor needles with other keys), or the path of a text corpus
(its sentences, as ``essay``). The unit count is found by
binary search with the tokenizer so ``apply_chat(prompt, answer_prefix)`` fits ``length`` tokens.

Teacher forcing: the target is the first answer after the prefix ("... mentioned in the provided text is
3183136"); the needle's own form, ``": 3183136"`` (the needle reads "... is: 3183136."), is accepted too
(``meta["tf_alternatives"]``, see :mod:`posbias.evaluation.teacher_forced`): RULER scores generations by
string match, which finds the value either way, and some models (Gemma 3) answer with the colon.
"""
from __future__ import annotations

from posbias.tasks.base import MAX_ITEMS, MAX_LENGTH, Instance, check_int, derive_rng, instance_id, realised_depth
from posbias.tasks.chat import apply_chat, prompt_tokens
from posbias.tasks.fitting import fit_units
from posbias.tasks.haystack import NOISE, haystack_units
from posbias.tasks.kv import WORDS, random_numbers

NEEDLE = "One of the special magic numbers for {key} is: {value}."
NIAH_INTRO = ("Some special magic numbers are hidden within the following text. Make sure to "
              "memorize it. I will quiz you about the numbers afterwards.")


def needle_form(value: str) -> list[str]:
    """The answer as the needle writes it after "is" (``": 3183136"``): the teacher-forced alternative."""
    return [f": {value}"]


def join_keys(keys: list[str]) -> str:
    if len(keys) == 1:
        return keys[0]
    if len(keys) == 2:
        return f"{keys[0]} and {keys[1]}"
    return ", ".join(keys[:-1]) + ", and " + keys[-1]


def question_and_prefix(keys: list[str], plural: bool) -> tuple[str, str]:
    k = join_keys(keys)
    if not plural:
        return (f"What is the special magic number for {k} mentioned in the provided text?",
                f"The special magic number for {k} mentioned in the provided text is")
    return (f"What are all the special magic numbers for {k} mentioned in the provided text?",
            f"The special magic numbers for {k} mentioned in the provided text are")


def random_keys(rng, count: int) -> list[str]:
    """``count`` distinct ``word-word`` keys (two different words)."""
    w = len(WORDS)
    space = w * (w - 1)
    if count > space:
        raise ValueError(f"cannot make {count} distinct needle keys (at most {space})")
    out = []
    for idx in rng.choice(space, size=count, replace=False):
        a, b = divmod(int(idx), w - 1)
        b += b >= a
        out.append(f"{WORDS[a]}-{WORDS[b]}")
    return out


def layout(units: list[str], groups: list[list[str]], gold_start: int, num_gold: int,
           depth: float, spread: bool) -> tuple[str, int, int]:
    """Context text, gold_index and num_items. ``groups``: needle groups in order, gold block
    first; it is moved to ``gold_start`` among the groups (spread) or inserted at the depth."""
    U = len(units)
    if not spread:
        pos = int(round(depth * U))
        block = [s for g in groups for s in g]
        return " ".join(units[:pos] + block + units[pos:]), pos, U + 1
    order = groups[num_gold:]
    order[gold_start:gold_start] = groups[:num_gold]
    K = len(order)
    slots: dict[int, list[str]] = {}
    for j, g in enumerate(order):
        slots.setdefault(int(round(j * U / (K - 1))), []).extend(g)
    pieces = []
    for p in range(U + 1):
        pieces.extend(slots.get(p, []))
        if p < U:
            pieces.append(units[p])
    return " ".join(pieces), gold_start, K


def niah_document(key: str, value: str, units: int, position: int, filler: list[str] | None = None) -> str:
    """A single-needle RULER *training* document: the evaluation prompt (``make_niah`` with
    ``num_needles=1``) followed by its answer, the needle after ``position`` of ``units`` noise units
    (with ``filler``: those units, e.g. corpus sentences, instead)."""
    hay = [NOISE] * units if filler is None else list(filler)
    hay.insert(position, NEEDLE.format(key=key, value=value))
    question, prefix = question_and_prefix([key], False)
    return f"{NIAH_INTRO}\n{' '.join(hay)}\n{question} {prefix} {value}."


def make_niah(*, tokenizer=None, n, depths, seed, split, haystack="noise", num_needles=1,
              num_values=1, num_queries=1, length=1024, shared_context=False) -> list[Instance]:
    """RULER needles (see the module docstring).

    ``shared_context=True`` (multi-key: ``num_needles >= 2``, ``num_queries == 1``): ``n`` haystacks
    whose needle groups stay in place, each asked once per depth about the key of the group at that
    depth, so the questions of one haystack share its context (``meta["context_id"]``,
    ``meta["context_chars"]``) and can be scored from one prefill.
    """
    task = "niah"
    if shared_context:
        return _make_niah_shared(tokenizer=tokenizer, n=n, depths=depths, seed=seed, split=split,
                                 haystack=haystack, num_needles=num_needles, num_values=num_values,
                                 num_queries=num_queries, length=length)
    K, V, Q, length = _check_options(haystack, num_needles, num_values, num_queries, length)
    if Q > K:
        raise ValueError(f"num_queries={Q} is more than num_needles={K} (keys to ask among)")
    samples = [_niah_sample(tokenizer, derive_rng(task, split, seed, i), K, V, Q, haystack, length, depths)
               for i in range(n)]
    out = []
    for depth in depths:
        for i, s in enumerate(samples):
            prompt, gi, ni = s["build"](s["units"], depth)
            answers = sorted(s["answers"], key=prompt.index)  # order of appearance
            out.append(Instance(
                id=instance_id(task, split, seed, depth, i), task=task, prompt=prompt, answers=answers,
                gold_index=gi, num_items=ni, depth=float(depth), metric="string_match_all",
                answer_prefix=s["prefix"],
                meta={"keys": s["keys"], "haystack": haystack, "haystack_units": s["units"],
                      "tf_alternatives": needle_form(answers[0]),
                      "num_needles": K, "num_values": V, "num_queries": Q, "length": length,
                      "prompt_tokens": prompt_tokens(tokenizer, apply_chat(tokenizer, prompt, s["prefix"])),
                      "realised_depth": realised_depth(gi, ni)},
            ))
    return out


def _check_options(haystack: str, num_needles, num_values, num_queries, length, min_needles: int = 1):
    """``(K, V, Q, length)`` checked: needles, values per needle, queried keys, prompt tokens."""
    if haystack != "needle":
        haystack_units(haystack)  # one line naming a bad haystack, or missing essays / corpus, before any fitting
    return (check_int("num_needles", num_needles, minimum=min_needles, maximum=MAX_ITEMS),
            check_int("num_values", num_values, maximum=MAX_ITEMS),
            check_int("num_queries", num_queries, maximum=MAX_ITEMS), check_int("length", length, maximum=MAX_LENGTH))


def _niah_sample(tokenizer, rng, K: int, V: int, Q: int, haystack: str, length: int, depths) -> dict:
    """One haystack with its needles: ``build(units, depth) -> (prompt, gold_index, num_items)`` and
    the largest haystack size (``units``) whose prompt fits ``length`` tokens at every depth."""
    keys, values, groups, units_of, max_units = draw_needles(rng, K, V, haystack, length)
    question, prefix = question_and_prefix(keys[:Q], V > 1 or Q > 1)

    def build(u: int, depth: float):
        gold_start = int(round(depth * (K - Q)))
        ctx, gi, ni = layout(units_of(u), groups, gold_start, Q, depth, K > Q)
        return f"{NIAH_INTRO}\n{ctx}\n{question}", gi, ni

    def tokens(u: int, depth: float) -> int:
        return prompt_tokens(tokenizer, apply_chat(tokenizer, build(u, depth)[0], prefix))

    u = fit_units(lambda u: tokens(u, 0.5), length, max_units=max_units, what="the NIAH prompt")
    while u > 0 and max(tokens(u, d) for d in depths) > length:
        u -= 1
    return {"build": build, "units": u, "prefix": prefix, "answers": [values[k * V + v] for k in range(Q)
                                                                       for v in range(V)], "keys": keys[:Q]}


def draw_needles(rng, K: int, V: int, haystack: str, length: int):
    """The needles of one instance: ``(keys, values, groups, units_of, max_units)``.

    ``groups[k]`` holds the ``V`` needles of key ``k`` (values ``values[k * V + v]``); ``units_of(u)``
    gives ``u`` haystack units; the ``needle`` haystack's distractors (at most one per token of the
    budget) take the keys after the first ``K`` and the values after the first ``K * V``, and
    ``max_units`` is their count (None for the unbounded noise / essay / corpus haystacks).
    """
    extra = min(length, 200_000) if haystack == "needle" else 0
    keys = random_keys(rng, K + extra)
    values = random_numbers(rng, K * V + extra, 7)
    groups = [[NEEDLE.format(key=keys[k], value=values[k * V + v]) for v in range(V)] for k in range(K)]
    if haystack == "needle":
        pool = [NEEDLE.format(key=keys[K + j], value=values[K * V + j]) for j in range(extra)]
        return keys, values, groups, (lambda u: pool[:u]), extra
    return keys, values, groups, haystack_units(haystack), None


def _make_niah_shared(*, tokenizer, n, depths, seed, split, haystack, num_needles, num_values, num_queries,
                      length) -> list[Instance]:
    task = "niah"
    K, V, _, length = _check_options(haystack, num_needles, num_values, num_queries, length, min_needles=2)
    if num_queries != 1:
        raise ValueError("shared_context asks one key per question: num_queries must be 1")
    out = []
    samples = []
    for i in range(n):
        keys, values, groups, units_of, max_units = draw_needles(derive_rng(task, split, seed, i), K, V,
                                                                 haystack, length)
        asked = {d: int(round(float(d) * (K - 1))) for d in depths}

        def prompt_of(u: int, k: int, units_of=units_of, groups=groups, keys=keys):
            ctx, _, _ = layout(units_of(u), groups, 0, 0, 0.0, True)
            context = f"{NIAH_INTRO}\n{ctx}\n"
            question, prefix = question_and_prefix([keys[k]], V > 1)
            return context, context + question, prefix

        def tokens(u: int, prompt_of=prompt_of, asked=asked) -> int:
            return max(prompt_tokens(tokenizer, apply_chat(tokenizer, p, pre))
                       for _, p, pre in (prompt_of(u, k) for k in set(asked.values())))

        u = fit_units(tokens, length, max_units=max_units, what="the NIAH prompt")
        samples.append((prompt_of, u, asked, values, keys))
    for depth in depths:
        for i, (prompt_of, u, asked, values, keys) in enumerate(samples):
            k = asked[depth]
            context, prompt, prefix = prompt_of(u, k)
            answers = [values[k * V + v] for v in range(V)]
            out.append(Instance(
                id=instance_id("niah-shared", split, seed, depth, i), task=task, prompt=prompt, answers=answers,
                gold_index=k, num_items=K, depth=float(depth), metric="string_match_all", answer_prefix=prefix,
                meta={"keys": [keys[k]], "haystack": haystack, "tf_alternatives": needle_form(answers[0]),
                      "haystack_units": u, "num_needles": K, "num_values": V, "num_queries": 1, "length": length,
                      "realised_depth": realised_depth(k, K),
                      "context_id": f"niah-shared_{split}_s{int(seed)}_c{i}", "context_chars": len(context)},
            ))
    return out
