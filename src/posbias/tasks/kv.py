"""Key-value retrieval: word keys -> numbers (``kv``) and lost-in-the-middle UUID JSON (``kv-uuid``).

Both move the gold pair to the requested index (pop + insert), so for a given seed and instance
index every depth shows the same records and only the gold pair moves.
"""
from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

from posbias.tasks.base import (
    MAX_ITEMS,
    Instance,
    check_file,
    check_int,
    depth_to_index,
    derive_rng,
    instance_id,
    realised_depth,
    render_items,
)
from posbias.utils.io import iter_jsonl_gz

# A few hundred distinct common lowercase English words (keys of ``kv``, needle keys of ``niah``).
_WORDS_TEXT = """
apple table river garden window pencil doctor music planet forest bottle candle castle
cloud coffee dragon engine falcon guitar hammer island jacket kettle ladder lemon magnet
mirror needle ocean orange pepper pillow pocket rabbit rocket saddle silver spider spoon
statue sugar tiger tomato tunnel turtle valley violin wagon wallet whale wizard yellow
zebra anchor arrow basket beacon blanket bridge bucket butter button cabin camera canyon
carpet carrot cherry circle clock copper cotton cradle crystal desert diamond dolphin
donkey eagle elbow feather finger flower fountain galaxy garlic ginger glove goat harbor
helmet honey horizon jungle kitten lantern leather letter lizard marble meadow melon monkey
mountain muffin napkin noodle onion oyster paddle palace parrot peanut pebble piano pirate
potato puzzle quilt radio rainbow raven ribbon salmon sandal scarf shadow shelter shovel
signal sketch socket spirit sponge stable storm summer sunset sweater tablet teapot thunder
ticket timber tractor trumpet tulip umbrella velvet village walnut winter wolf wool yogurt
acorn album alley almond amber angle ankle apron arch atlas attic avocado badge bakery
balcony bamboo banana banner barrel beetle bench berry bicycle biscuit blossom boulder
bracelet branch breeze brick broom bubble buffalo cactus camel canoe captain cargo cedar
cellar chalk chapel cheese chimney cider cinema citrus clover cobra compass cookie coral
cottage cousin coyote crane crayon cricket crown cucumber curtain cushion daisy dancer
dentist diary dinner dragonfly drum dune easel ember emerald fence ferry fiddle figure
fossil fox frog furnace gadget garage gazelle geyser glacier globe goose granite grape
gravel hamster harp hazel hedge heron hippo hockey hoodie hornet igloo iron ivory jaguar
jasmine jelly jewel juice kayak kiwi koala lagoon lava lemonade library lily lobster locket
lotus lumber mango maple mask meteor mitten moose mosaic moth mustard nectar nest nickel
nutmeg oak oasis olive orchard orchid otter owl panda panther papaya parcel pasta peach
pearl pelican penguin perfume pickle pigeon pine pizza plum poem pony poppy puppy pumpkin
python quartz quiver raisin ranch reef rhino riddle robin rose ruby saffron sailor salad
sapphire satchel sausage scooter seal sequin shark sheep shell shrimp silk skate sled
slipper snail sofa sparrow spinach squash squirrel stamp starfish stove strawberry stream
sunflower swan syrup taco tangerine tent thistle thread toast tofu torch tower trout truck
trunk tuba tuna vase vessel vine volcano waffle walrus wheat whistle willow wren yacht yarn
zipper badger bagel beaver bison blender bonnet boxer cabbage candy canvas carton cashew
cereal chess chestnut cobalt comet cookbook corn crab cupcake dagger denim dessert dove
drawer dumpling eel elk envelope fabric fig flute fudge gecko gem goblet gopher gorilla
gourd guava gull hatchet hawk hay hyena iguana inkwell jar jeep kale kelp lamb lark leek
lentil lime llama lynx mackerel magpie mammoth marlin mast meringue minnow mole mushroom
muskrat nugget ostrich pancake parsley pastry peacock pecan pheasant pier pistachio plank
platypus porcupine pretzel prune quail radish raft rattle reindeer rhubarb saucer scallop
seahorse sesame skunk sloth snapper sorrel soup spruce stallion sturgeon swallow tapir
termite toucan trolley tumbleweed turnip vulture weasel wombat yak
"""
WORDS: tuple[str, ...] = tuple(_WORDS_TEXT.split())

KV_WORDS_PROMPT = (
    "Extract the value corresponding to the specified key in the list below.\n\n"
    "{records}\n\nKey: {key}\nCorresponding value:"
)
KV_JSON_PROMPT = (
    "Extract the value corresponding to the specified key in the JSON object below.\n\n"
    "JSON data:\n{records}\n\nKey: \"{key}\"\nCorresponding value:"
)


def random_numbers(rng, count: int, digits: int) -> list[str]:
    """``count`` distinct ``digits``-digit numbers (no leading zero) as strings."""
    low = 10 ** (digits - 1) if digits > 1 else 0
    pool = 10**digits - low
    if count > pool:
        raise ValueError(f"cannot draw {count} distinct {digits}-digit values (only {pool} exist)")
    return [str(low + int(v)) for v in rng.choice(pool, size=count, replace=False)]


def move(items: list, src: int, dst: int) -> list:
    """Copy of ``items`` with the element at ``src`` moved to ``dst`` (pop + insert)."""
    out = list(items)
    out.insert(dst, out.pop(src))
    return out


def word_record_lines(records: list[tuple[str, str]]) -> list[str]:
    """One ``key: value`` line per record."""
    return [f"{k}: {v}" for k, v in records]


def format_word_records(records: list[tuple[str, str]]) -> str:
    return "\n".join(word_record_lines(records))


def json_record_lines(records: list[tuple[str, str]]) -> list[str]:
    """A JSON object, one ``"key": "value"`` pair per line (the lost-in-the-middle layout): the lines."""
    lines = []
    for i, (k, v) in enumerate(records):
        start = "{" if i == 0 else " "
        end = "}" if i == len(records) - 1 else ","
        lines.append(f"{start}{json.dumps(k)}: {json.dumps(v)}{end}")
    return lines


def format_json_records(records: list[tuple[str, str]]) -> str:
    """A JSON object, one ``"key": "value"`` pair per line (the lost-in-the-middle layout)."""
    return "\n".join(json_record_lines(records)) if records else "{}"


def quoted_targets(value: str) -> dict:
    """Teacher-forced targets of a JSON string value: as the format writes it, with its opening quote
    (``"2d84b170-...``: Qwen2.5 answers so), and the bare value after a space (`` 2d84b170-...``: Gemma 3
    and SmolLM2 drop the quote) as the accepted other form (``meta["tf_alternatives"]``, see
    :mod:`posbias.evaluation.teacher_forced`)."""
    return {"tf_target": json.dumps(value)[:-1], "tf_alternatives": [f" {value}"]}


def _kv_instances(task: str, samples: list[dict[str, Any]], *, depths, split, seed, template,
                  lines, metric="substring", quoted: bool = False) -> list[Instance]:
    """samples: dicts with records (gold at ``gold``), key, value, and meta; ``lines(records)``: one
    line of text per record (their character spans are ``meta["item_spans"]``)."""
    out = []
    for depth in depths:
        for i, s in enumerate(samples):
            records = s["records"]
            idx = depth_to_index(depth, len(records))
            moved = move(records, s["gold"], idx)
            assert moved[idx] == (s["key"], s["value"])
            prompt, spans = render_items(template, "records", lines(moved), key=s["key"])
            out.append(Instance(
                id=instance_id(task, split, seed, depth, i), task=task, prompt=prompt,
                answers=[s["value"]], gold_index=idx, num_items=len(moved), depth=float(depth),
                metric=metric,
                meta={"key": s["key"], "realised_depth": realised_depth(idx, len(moved)), **s["meta"],
                      "item_spans": spans,
                      **(quoted_targets(s["value"]) if quoted else {})},
            ))
    return out


def make_kv(*, tokenizer=None, n, depths, seed, split, num_keys=30, value_digits=7, key_words=1,
            shared_context=False, closing="", query_aware=False) -> list[Instance]:
    """Word keys -> ``value_digits``-digit numbers, one ``key: value`` per line.

    ``closing``: a line put after the records, before the question (e.g. ``"That is the whole list."``): a
    control for whether the last record's adjacency to the question matters.
    ``query_aware``: the key also stated before the records (query-aware contextualization, Liu et al., TACL
    2024), so the records are read knowing what is asked: a prompt change, the bound of what query-awareness
    buys, not a model fix. With ``shared_context`` the questions keep their ids and records but, the key
    being part of the context now, each is its own prompt.

    ``shared_context=True``: ``n`` record lists, each asked once per depth about the record that
    already sits there (nothing moves), so the questions of one list share its context and can be
    scored from one prefill (:func:`posbias.evaluation.teacher_forced.score_instances`).

    ``key_words > 1`` makes compound keys of that many distinct words joined by ``-``
    (``apple-river: 1234567``); no word occurs in two keys. The format decides whether a model shows a
    lost-in-the-middle U: Gemma 3 270M reads only the beginning of single-word keys.
    """
    task = "kv"
    num_keys = check_int("num_keys", num_keys, maximum=MAX_ITEMS)
    value_digits = check_int("value_digits", value_digits, maximum=18)
    key_words = check_int("key_words", key_words, maximum=8)
    if num_keys * key_words > len(WORDS):
        raise ValueError(
            f"num_keys={num_keys} x key_words={key_words} is more than the {len(WORDS)} words of the "
            "built-in key vocabulary"
        )
    samples = []
    for i in range(n):
        rng = derive_rng(task, split, seed, i)
        words = [WORDS[j] for j in rng.choice(len(WORDS), size=num_keys * key_words, replace=False)]
        keys = ["-".join(words[k * key_words:(k + 1) * key_words]) for k in range(num_keys)]
        values = random_numbers(rng, num_keys, value_digits)
        gold = int(rng.integers(num_keys))
        samples.append({"records": list(zip(keys, values)), "gold": gold, "key": keys[gold],
                        "value": values[gold], "meta": {}})
    template = words_template(closing, query_aware)
    if shared_context:
        return _kv_shared_instances(samples, depths=depths, split=split, seed=seed, template=template)
    return _kv_instances(task, samples, depths=depths, split=split, seed=seed, template=template,
                         lines=word_record_lines)


def words_template(closing: str = "", query_aware: bool = False) -> str:
    """The word-KV prompt, with ``closing`` on its own line after the records when given, and the key also
    before the records with ``query_aware``."""
    if not isinstance(closing, str) or "\n" in closing:
        raise ValueError(f"closing must be one line of text, got {closing!r}")
    template = KV_WORDS_PROMPT
    if closing:
        template = template.replace("{records}", "{records}\n" + closing.replace("{", "{{").replace("}", "}}"))
    return template.replace("{records}", QUERY_FIRST + "{records}") if query_aware else template


QUERY_FIRST = "Key: {key}\n\n"  # query-aware contextualization: the question before the records too


def _kv_shared_instances(samples, *, depths, split, seed, template: str = KV_WORDS_PROMPT) -> list[Instance]:
    """One context per sample (instruction + records), one question per depth after it.

    ``meta["context_id"]`` names the context and ``meta["context_chars"]`` is its length in the
    prompt: ``prompt[:context_chars]`` is identical for every question of that context.
    """
    task = "kv"
    head, tail = template.split("{records}")
    out = []
    for depth in depths:
        for i, s in enumerate(samples):
            records = s["records"]
            idx = depth_to_index(depth, len(records))
            key, value = records[idx]
            prompt, spans = render_items(template, "records", word_record_lines(records), key=key)
            context = prompt[:prompt.rindex("Key:")]
            shared = {} if "{key}" in head else {"context_id": f"kv-shared_{split}_s{int(seed)}_c{i}",
                                                 "context_chars": len(context)}  # query-aware: its own prompt
            out.append(Instance(
                id=instance_id("kv-shared", split, seed, depth, i), task=task, prompt=prompt, answers=[value],
                gold_index=idx, num_items=len(records), depth=float(depth), metric="substring",
                meta={"key": key, "realised_depth": realised_depth(idx, len(records)), "item_spans": spans,
                      **shared},
            ))
    return out


def split_indices(count: int, split: str) -> list[int]:
    """File examples of a split: even example indices -> ``search``, odd -> ``eval``."""
    return list(range(0 if split == "search" else 1, count, 2))


def pick_examples(task: str, count: int, n: int, split: str, seed: int, path: Path) -> list[int]:
    """``n`` example indices of the split, a seeded permutation of its examples."""
    pool = split_indices(count, split)
    if n > len(pool):
        raise ValueError(
            f"n={n} is more than the {len(pool)} examples of split {split!r} in {path} "
            f"({count} examples; even indices are 'search', odd ones 'eval')"
        )
    rng = derive_rng(task, split, seed)
    return [pool[j] for j in rng.permutation(len(pool))[:n]]


def record_field(rec: dict, name: str, where: str, typ: type | tuple = object):
    if name not in rec:
        raise ValueError(f"{where}: missing field {name!r}")
    val = rec[name]
    if not isinstance(val, typ):
        raise ValueError(f"{where}: field {name!r} has the wrong type ({type(val).__name__})")
    return val


def load_kv_file(path: str | Path) -> list[dict[str, Any]]:
    """Read a lost-in-the-middle ``kv-retrieval-*_keys.jsonl.gz`` file (checked, file:line errors)."""
    path = check_file(path)
    out = []
    for no, rec in iter_jsonl_gz(path):
        where = f"{path}:{no}"
        records = record_field(rec, "ordered_kv_records", where, list)
        key = record_field(rec, "key", where, str)
        value = record_field(rec, "value", where, str)
        pairs = []
        for r in records:
            if not (isinstance(r, (list, tuple)) and len(r) == 2 and all(isinstance(x, str) for x in r)):
                raise ValueError(f"{where}: ordered_kv_records entries must be [key, value] strings")
            pairs.append((r[0], r[1]))
        gold = [j for j, (k, _) in enumerate(pairs) if k == key]
        if len(gold) != 1:
            raise ValueError(f"{where}: key {key!r} occurs {len(gold)} times in ordered_kv_records")
        if pairs[gold[0]][1] != value:
            raise ValueError(f"{where}: the record of key {key!r} does not hold value {value!r}")
        out.append({"records": pairs, "gold": gold[0], "key": key, "value": value, "line": no})
    if not out:
        raise ValueError(f"{path}: no examples")
    return out


def make_kv_uuid(*, tokenizer=None, n, depths, seed, split, num_keys=None, path=None) -> list[Instance]:
    """Lost-in-the-middle KV: UUID keys and values as a JSON object, one pair per line.

    Generated from the seeded rng (``num_keys``, default 75), or read from ``path`` (a
    ``kv-retrieval-*_keys.jsonl.gz`` file; even example indices are the ``search`` split, odd
    ones ``eval``; ``num_keys`` smaller than the file's keeps the gold pair and a seeded subset
    of the others in their order).
    """
    task = "kv-uuid"
    if num_keys is not None:
        num_keys = check_int("num_keys", num_keys, maximum=MAX_ITEMS)
    samples = []
    if path is None:
        num_keys = 75 if num_keys is None else num_keys
        for i in range(n):
            rng = derive_rng(task, split, seed, i)
            ids = [str(uuid.UUID(bytes=rng.bytes(16), version=4)) for _ in range(2 * num_keys)]
            if len(set(ids)) != len(ids):  # astronomically unlikely
                raise RuntimeError("UUID collision")
            keys, values = ids[:num_keys], ids[num_keys:]
            gold = int(rng.integers(num_keys))
            samples.append({"records": list(zip(keys, values)), "gold": gold, "key": keys[gold],
                            "value": values[gold], "meta": {}})
    else:
        data = load_kv_file(path)
        path = Path(path)
        for ex in pick_examples(task, len(data), n, split, seed, path):
            d = data[ex]
            records, gold = d["records"], d["gold"]
            if num_keys is not None and num_keys != len(records):
                if num_keys > len(records):
                    raise ValueError(
                        f"num_keys={num_keys} is more than the {len(records)} keys of "
                        f"{path}:{d['line']}"
                    )
                rng = derive_rng(task, split, seed, ex)
                others = [j for j in range(len(records)) if j != gold]
                keep = sorted([gold, *rng.choice(others, size=num_keys - 1, replace=False).tolist()])
                records, gold = [records[j] for j in keep], keep.index(gold)
            samples.append({"records": records, "gold": gold, "key": d["key"], "value": d["value"],
                            "meta": {"source": f"{path}:{d['line']}", "example": ex}})
    # values are JSON strings: most models continue "Corresponding value:" with the opening quote, so
    # the teacher-forced target is '"<value>', the bare value the accepted other form (quoted_targets;
    # the substring metric of generation is unchanged)
    return _kv_instances(task, samples, depths=depths, split=split, seed=seed,
                         template=KV_JSON_PROMPT, lines=json_record_lines, quoted=True)
