"""The study's text: the corpus split into a training part and a held-out tail for perplexity."""
from __future__ import annotations

import json
from typing import Callable

from posbias.study.config import HELDOUT_CHARS_PER_TOKEN, MAX_HELDOUT_FRACTION, StudyConfig, has_split, split_files
from posbias.utils.corpus import load_texts
from posbias.utils.io import atomic_write_text


def prepare_data(cfg: StudyConfig, log: Callable = print, before_write: Callable = lambda: None
                 ) -> tuple[str | None, str | None]:
    """Split the corpus into a training part and a held-out part for perplexity.

    Returns ``(training corpus path or None for the trainer's default, held-out text path or
    None)``. With ``--heldout`` the corpus is used as is. Otherwise documents are taken from the
    *end* of the corpus (the last one cut at a character boundary if needed) until about
    ``HELDOUT_CHARS_PER_TOKEN x`` the perplexity token budget (at most 30% of the corpus) is
    held out; both parts are written once to ``<out>/data/{train,heldout}.jsonl`` (reused on
    resume, also by an invocation without perplexity) and every scheme trains on the same
    ``train.jsonl``. No perplexity contexts and no earlier split: no split.
    The split is computed (and a corpus too small for it refused) before ``before_write()`` runs
    and anything is written, so a rejected corpus never locks the run folder.
    """
    if cfg.heldout:
        return cfg.corpus, cfg.heldout
    train_path, held_path = split_files(cfg.out)
    if has_split(cfg.out):  # an earlier invocation's split (also when this one measures no perplexity)
        return str(train_path.resolve()), str(held_path.resolve())
    if not cfg.ppl_contexts:
        return cfg.corpus, None
    train, held, got = split_heldout(cfg, log)
    before_write()
    atomic_write_text(train_path, "".join(json.dumps({"text": t}) + "\n" for t in train if t.strip()))
    atomic_write_text(held_path, "".join(json.dumps({"text": t}) + "\n" for t in held if t.strip()))
    log(f"[study] corpus split: {len(train)} documents for training, {got} characters held out for perplexity")
    return str(train_path.resolve()), str(held_path.resolve())


def split_heldout(cfg: StudyConfig, log: Callable = print) -> tuple[list[str], list[str], int]:
    """``(training documents, held-out documents, held-out characters)`` (see :func:`prepare_data`)."""
    texts = load_texts(cfg.corpus)
    total = sum(len(t) for t in texts)
    want = cfg.ppl_eval_tokens * HELDOUT_CHARS_PER_TOKEN
    if want > MAX_HELDOUT_FRACTION * total:
        log(f"[study] corpus has {total} characters: holding out {MAX_HELDOUT_FRACTION:.0%} of it for perplexity "
            f"instead of ~{want}; the longest perplexity contexts may get few windows")
        want = int(MAX_HELDOUT_FRACTION * total)
    train, held, got = list(texts), [], 0
    while train and got < want:
        doc = train.pop()
        need = want - got
        if len(doc) > need and len(doc) - need > 0:
            train.append(doc[: len(doc) - need])
            doc = doc[len(doc) - need:]
        held.insert(0, doc)
        got += len(doc)
    if not train:
        raise ValueError("corpus too small to hold out text for perplexity; pass --ppl-multipliers '' or --heldout")
    return train, held, got
