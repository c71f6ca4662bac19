"""Small byte-level BPE tokenizers trained on the training corpus (for CPU-sized studies).

SmolLM2's 49K-token vocabulary makes the output layer the largest cost of a tiny model (4 x 128:
~6M of its ~7M parameters sit in the embedding). A byte-level BPE with a few hundred to a few
thousand tokens, trained on the same corpus, keeps every text representable (byte fallback via
the 256-symbol byte alphabet) and makes CPU training several times faster.

Digits are always split into single tokens (as SmolLM2 and Llama do), so a 5-digit passkey is 5
tokens whatever the vocabulary: retrieval is a copy of 5 tokens, not of a memorised word.

Spec strings accepted by :func:`resolve_tokenizer_spec`: ``"bpe:<vocab size>"`` (e.g. ``bpe:1024``).
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Iterable, Sequence

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from posbias.tasks.passkey import task_vocabulary_texts

SPEC = re.compile(r"^bpe[:-](\d+)$")
MIN_VOCAB = 300  # 256 bytes + special tokens + a few merges
EOS, PAD = "<|endoftext|>", "<|pad|>"


def parse_bpe_spec(spec: str | None) -> int | None:
    """Vocabulary size of a ``"bpe:<N>"`` spec, or None when ``spec`` is something else."""
    if spec is None:
        return None
    m = SPEC.match(str(spec).strip().lower())
    if not m:
        return None
    size = int(m.group(1))
    if size < MIN_VOCAB:
        raise ValueError(f"tokenizer {spec!r}: a byte-level BPE needs at least {MIN_VOCAB} tokens, got {size}")
    return size


def train_bpe_tokenizer(texts: Iterable[str], vocab_size: int, out_dir: str | Path, *,
                        extra_texts: Sequence[str] = ()):
    """Train a byte-level BPE of ``vocab_size`` tokens on ``texts`` and save it to ``out_dir``.

    Returns the :class:`transformers.PreTrainedTokenizerFast` (EOS ``<|endoftext|>``, also used as
    BOS; PAD ``<|pad|>``). ``extra_texts`` (e.g. the passkey filler) are added to the training
    text so that text the evaluation uses is tokenized compactly. Deterministic for the same input.
    """

    if vocab_size < MIN_VOCAB:
        raise ValueError(f"vocab_size must be >= {MIN_VOCAB}, got {vocab_size}")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOS, PAD], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(_chain(texts, extra_texts), trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS, bos_token=EOS, pad_token=PAD,
                                   unk_token=None, model_max_length=10 ** 9)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(str(out_dir))
    return fast


def _chain(texts: Iterable[str], extra: Sequence[str]):
    yield from texts
    yield from extra


def resolve_tokenizer_spec(spec: str | None, texts: Sequence[str], out_dir: str | Path) -> str | None:
    """``spec`` unchanged unless it is ``"bpe:<N>"``: then train (or reuse) the BPE in ``out_dir``
    on ``texts`` plus :func:`synthetic_task_texts` and return that folder as a string."""
    size = parse_bpe_spec(spec)
    if size is None:
        return spec
    out_dir = Path(out_dir)
    if (out_dir / "tokenizer.json").exists():
        return str(out_dir)
    train_bpe_tokenizer(texts, size, out_dir, extra_texts=synthetic_task_texts())
    return str(out_dir)


def synthetic_task_texts(copies: int = 200) -> list[str]:
    """The synthetic tasks' text (:func:`posbias.tasks.passkey.task_vocabulary_texts`): a BAM study
    trains on passkey documents and evaluates on them, and a compact filler lets the training
    context hold more of it."""

    return task_vocabulary_texts(copies)
