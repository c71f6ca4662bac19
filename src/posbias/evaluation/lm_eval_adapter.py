"""lm-evaluation-harness adapter: evaluate a (patched) model offline on local task files.

    from posbias.evaluation.lm_eval_adapter import PosbiasLM
    import lm_eval
    from lm_eval.tasks import TaskManager

    lm = PosbiasLM(model, tokenizer, method="ms-poe", method_options={"r_min": 1.2}, batch_size=8)
    res = lm_eval.simple_evaluate(model=lm, tasks=["my_task"], task_manager=TaskManager(include_path="tasks/"))
    lm.close()  # removes a method the adapter applied itself

Requests are scored through ``handle.model`` with the same call the posbias scorers use
(left-padded batches, explicit ``position_ids = cumsum(mask) - 1``, ``logits_to_keep``; greedy
generation is a manual loop with ``past_key_values``), so every method in
:mod:`posbias.methods` works, including wrappers such as Attention Buckets.

``lm_eval`` is an optional dependency (``pip install lm-eval``); importing this module without it
raises ImportError with that hint.
"""
from __future__ import annotations

from typing import Any

import torch
from tqdm.auto import tqdm

from posbias.architecture.layers import model_device
from posbias.evaluation.generation import greedy_batch
from posbias.evaluation.scoring import Continuation, prompt_dependent, score_shared_context, score_token_rows
from posbias.methods import MethodHandle, apply_method
from posbias.models import load_model
from posbias.models.adapter import eval_settings
from posbias.models.options import LoadOptions

try:
    from lm_eval.api.model import TemplateLM
    from lm_eval.api.registry import register_model
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError("posbias.evaluation.lm_eval_adapter needs lm-evaluation-harness: pip install lm-eval") from e

LM_EVAL_NAME = "posbias"  # lm_eval --model posbias (through the posbias-lm-eval command)
# model_args that are not a method option (the rest are passed to the method, e.g. factor=2 for pi).
MODEL_ARGS = ("pretrained", "method", "device", "dtype", "batch_size", "max_batch_size", "max_length",
              "max_gen_toks")


@register_model(LM_EVAL_NAME)
class PosbiasLM(TemplateLM):
    """An ``lm_eval`` model wrapping ``(model, tokenizer)`` and an optional posbias method.

    Args:
        model: a Hugging Face causal LM.
        tokenizer: its tokenizer.
        method: ``None`` / ``"none"``, a method name (applied here and removed by :meth:`close`), or a
            :class:`posbias.methods.MethodHandle` already applied by the caller.
        method_options: options for a method given by name.
        batch_size: requests per forward pass.
        max_length: context window (default the model's ``max_position_embeddings``).
        max_gen_toks: default generation budget for ``generate_until``.
    """

    def __init__(self, model, tokenizer, method=None, method_options: dict | None = None, batch_size: int = 8,
                 max_length: int | None = None, max_gen_toks: int = 64):
        super().__init__()

        self.tokenizer = tokenizer
        self.base_model = model
        self._owns_handle = False
        if isinstance(method, MethodHandle):
            self.handle = method
        else:
            self.handle = apply_method(model, method or "none", **(method_options or {}))
            self._owns_handle = True
        self.batch_size = max(1, int(batch_size))
        self.max_length = int(max_length or getattr(model.config, "max_position_embeddings", 2048) or 2048)
        self.max_gen_toks = int(max_gen_toks)
        self._device = model_device(model)

    # -- construction from lm_eval's --model_args ------------------------------------------------
    @classmethod
    def create_from_arg_string(cls, arg_string: str, additional_config: dict | None = None) -> "PosbiasLM":
        """``pretrained=...,method=lpes,factors=...,device=...,dtype=...`` (lm_eval's ``--model_args``)."""
        from lm_eval.utils import simple_parse_args_string  # noqa: PLC0415 (optional: lm-eval)

        return cls.from_model_args(simple_parse_args_string(arg_string), additional_config)

    @classmethod
    def create_from_arg_obj(cls, arg_dict: dict, additional_config: dict | None = None) -> "PosbiasLM":
        return cls.from_model_args(dict(arg_dict), additional_config)

    @classmethod
    def from_model_args(cls, args: dict, additional_config: dict | None = None) -> "PosbiasLM":
        """Load ``pretrained`` (a folder, alias, ``.gguf`` or a ``posbias apply`` folder, through
        :func:`posbias.models.load_model`) on ``device`` in ``dtype`` and apply ``method`` with the other
        arguments as its options (``factors`` for lpes). ``device`` defaults to the first CUDA device when
        there is one (else the CPU), ``dtype`` to bfloat16 on CUDA and float32 on the CPU; lm_eval's own
        ``--device`` / ``--batch_size`` apply where ``--model_args`` does not set them."""

        args = {**_harness_settings(additional_config), **args}
        if "pretrained" not in args:
            raise ValueError("lm_eval --model posbias needs --model_args pretrained=MODEL (a folder, alias or "
                             ".gguf file)")
        load = LoadOptions(str(args.get("device") or "auto"), str(args.get("dtype") or "auto"))
        options = {k: v for k, v in args.items() if k not in MODEL_ARGS}
        eval_settings(str(args["pretrained"]), args.get("method") or "none", options)  # none on a posbias apply folder
        model, tokenizer = load_model(str(args["pretrained"]), load)
        return cls(model, tokenizer, method=args.get("method") or "none", method_options=options,
                   batch_size=_batch_size(args.get("batch_size")), max_length=args.get("max_length"),
                   max_gen_toks=int(args.get("max_gen_toks", 64)))

    # -- lm_eval plumbing ---------------------------------------------------------------------
    @property
    def eot_token_id(self) -> int:
        eos = self.tokenizer.eos_token_id
        return int(eos if eos is not None else self.tokenizer.pad_token_id)

    @property
    def prefix_token_id(self) -> int:
        bos = self.tokenizer.bos_token_id
        return int(bos if bos is not None else self.eot_token_id)

    @property
    def device(self):
        return self._device

    @property
    def tokenizer_name(self) -> str:
        return getattr(self.tokenizer, "name_or_path", "posbias").replace("/", "__")

    def tok_encode(self, string: str, add_special_tokens: bool | None = None, **kwargs) -> list[int]:
        return self.tokenizer(string, add_special_tokens=bool(add_special_tokens))["input_ids"]

    def tok_decode(self, tokens) -> str:
        return self.tokenizer.decode(tokens, skip_special_tokens=True)

    def close(self) -> None:
        """Remove the method if this adapter applied it."""
        if self._owns_handle:
            self.handle.remove()

    # -- scoring ------------------------------------------------------------------------------
    def _pad_id(self) -> int:
        pid = self.tokenizer.pad_token_id
        return int(pid if pid is not None else self.eot_token_id)

    @torch.no_grad()
    def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False, **kwargs) -> list[tuple[float, bool]]:
        results: list[tuple[float, bool] | None] = [None] * len(requests)
        items = []
        for i, (key, ctx, cont) in enumerate(requests):
            if not cont:
                results[i] = (0.0, True)
                continue
            whole = (list(ctx) + list(cont))[-(self.max_length + 1):]
            inp = whole[:-1]
            n_cont = min(len(cont), len(inp))
            items.append((i, key, inp, list(cont)[-n_cont:]))

        bar = tqdm(total=len(items), desc="loglikelihood", unit="request", disable=disable_tqdm, leave=False)
        items = self._score_shared_contexts(items, results, bar)
        items.sort(key=lambda x: -len(x[2]))  # similar lengths together; results restored by index
        for start in range(0, len(items), self.batch_size):
            chunk = items[start:start + self.batch_size]
            prompts = [inp[: len(inp) - len(cont) + 1] for _i, _key, inp, cont in chunk]
            rows = score_token_rows(self.handle.model, prompts, [c[3] for c in chunk], self._pad_id())
            for r, (i, key, _inp, _cont) in zip(rows, chunk):
                results[i] = (r["logprob"], r["em"])
                self.cache_hook.add_partial("loglikelihood", key, results[i])
            bar.update(len(chunk))
        bar.close()
        return results  # type: ignore[return-value]

    def _score_shared_contexts(self, items: list, results: list, bar=None) -> list:
        """Score requests that share their whole context (the choices of a multiple-choice question)
        from one prefill of it (:func:`~posbias.evaluation.scoring.score_shared_context`, equal to
        scoring each row within float tolerance); returns the items left to score row by row (``bar``, a
        tqdm bar, advances by the requests scored here). A
        :func:`~posbias.evaluation.scoring.prompt_dependent` model scores every row alone."""

        if prompt_dependent(self.handle.model):
            return items
        groups: dict[tuple, list] = {}
        for item in items:
            _i, _key, inp, cont = item
            groups.setdefault(tuple(inp[: len(inp) - len(cont) + 1]), []).append(item)
        rest = []
        for context, members in groups.items():
            if len(members) < 2:
                rest += members
                continue
            conts = [Continuation(str(n), list(cont), len(cont), len(context)) for n, (_i, _k, _inp, cont)
                     in enumerate(members)]
            rows = score_shared_context(self.handle.model, list(context), conts, self._pad_id(),
                                        batch_size=max(self.batch_size, 4))
            for r, (i, key, _inp, _cont) in zip(rows, members):
                results[i] = (r["logprob"], r["em"])
                self.cache_hook.add_partial("loglikelihood", key, results[i])
            if bar is not None:
                bar.update(len(members))
        return rest

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        from lm_eval.utils import get_rolling_token_windows, make_disjoint_window  # noqa: PLC0415 (optional: lm-eval)

        out = []
        for req in requests:
            (string,) = req.args
            windows = [make_disjoint_window(w) for w in get_rolling_token_windows(
                token_list=self.tok_encode(string), prefix_token=self.prefix_token_id,
                max_seq_len=self.max_length, context_len=1)]
            scores = self._loglikelihood_tokens([(None, ctx, cont) for ctx, cont in windows])
            total = sum(s for s, _ in scores)
            out.append(total)
            self.cache_hook.add_partial("loglikelihood_rolling", (string,), total)
        return out

    @torch.no_grad()
    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        results: list[str] = [""] * len(requests)
        order = sorted(range(len(requests)), key=lambda i: -len(requests[i].args[0]))
        for start in range(0, len(order), self.batch_size):
            idx = order[start:start + self.batch_size]
            ctxs = [requests[i].args[0] for i in idx]
            gen_kwargs: dict[str, Any] = dict(requests[idx[0]].args[1] or {})
            until = gen_kwargs.get("until") or []
            until = [until] if isinstance(until, str) else list(until)
            max_new = int(gen_kwargs.get("max_gen_toks", self.max_gen_toks))
            texts = self._greedy(ctxs, max_new, until)
            for i, text in zip(idx, texts):
                results[i] = text
                self.cache_hook.add_partial("generate_until", requests[i].args, text)
        return results

    def _greedy(self, contexts: list[str], max_new: int, until: list[str]) -> list[str]:
        budget = max(1, self.max_length - max_new)
        seqs = [self.tok_encode(c)[-budget:] or [self.prefix_token_id] for c in contexts]
        stop = (lambda toks: any(u and u in self.tok_decode(toks) for u in until)) if until else None
        gen = greedy_batch(self.handle.model, seqs, self._pad_id(), {self.eot_token_id}, max_new, stop=stop)
        texts = []
        for g in gen:
            text = self.tok_decode(g)
            for u in until:
                if u and u in text:
                    text = text.split(u)[0]
            texts.append(text)
        return texts


HARNESS_DEFAULT_DEVICE = "cuda:0"  # lm-eval's EvaluatorConfig.device when its --device is not given


def _harness_settings(additional_config: dict | None) -> dict:
    """lm-eval's own settings (``--device``, ``--batch_size``, ...) without the unset ones. lm-eval fills
    ``device`` with ``cuda:0`` when ``--device`` is not given, so that value counts as ``auto`` (the CPU where
    there is no CUDA), as lm-eval's ``hf`` model treats it; ``device=`` in ``--model_args`` is always strict."""
    settings = {k: v for k, v in (additional_config or {}).items() if v is not None}
    if settings.get("device") == HARNESS_DEFAULT_DEVICE:
        settings["device"] = "auto"
    return settings


def _batch_size(value) -> int:
    """lm_eval's batch size (a number, or ``auto`` / ``auto:N``, which score 8 requests per pass here)."""
    try:
        return max(1, int(value))
    except (TypeError, ValueError):
        return 8
