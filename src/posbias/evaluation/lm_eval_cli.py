"""``posbias-lm-eval``: lm-evaluation-harness's own command line with ``--model posbias`` available.

lm-eval 0.4 finds models only in its registry (no plugin entry points), so this command imports
:mod:`posbias.evaluation.lm_eval_adapter` (which registers :class:`~posbias.evaluation.lm_eval_adapter.PosbiasLM`
as ``posbias``) and hands every argument to ``lm_eval.__main__.cli_evaluate``::

    posbias-lm-eval --model posbias --model_args pretrained=smollm2-135m,method=lpes,factors=best_factors.json \\
        --tasks arc_easy --output_path results/
"""
from __future__ import annotations

import posbias.evaluation.lm_eval_adapter  # noqa: F401  (registers --model posbias)


def main() -> None:
    """Register the posbias model with lm-eval and run lm-eval's command line."""
    from lm_eval.__main__ import cli_evaluate  # noqa: PLC0415 (optional: lm-eval)


    cli_evaluate()


if __name__ == "__main__":
    main()
