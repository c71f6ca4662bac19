"""Attention sorting as a method: the model is unchanged; before each batch is scored its prompts are re-shown
with the records sorted by the attention they received. The step itself is
:func:`posbias.evaluation.attention_sorting.attention_sorted` (it scores, so it lives with the scorers), which
``posbias eval`` / ``compare`` run with this handle's options (:data:`posbias.evaluation.session.PROMPT_STEPS`)."""
from __future__ import annotations

from posbias.methods.registry import MethodHandle, register_method
from posbias.utils.options import check_int

ORDERS = ("last", "first")  # where the most attended record is shown


@register_method("attention-sorting", "records re-shown sorted by the attention they receive (options rounds, "
                 "most_attended=last|first; Peysakhovich and Lerer 2023): a prompt change, tasks with records",
                 aliases=("attention-sort",))
def apply_attention_sorting(model, rounds: int = 1, most_attended: str = "last") -> MethodHandle:
    rounds = check_int("attention-sorting: rounds", rounds, maximum=10)
    if most_attended not in ORDERS:
        raise ValueError(f"attention-sorting: most_attended must be one of {', '.join(ORDERS)}, got {most_attended!r}")

    return MethodHandle("attention-sorting", model, options={"rounds": rounds, "most_attended": most_attended})
