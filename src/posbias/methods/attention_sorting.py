"""Attention sorting as a method: the model is unchanged; before each batch is scored its prompts are re-shown
with the records sorted by the attention they received (:mod:`posbias.evaluation.attention_sorting`; the
handle's ``state["prepare"]``, which ``posbias eval`` / ``compare`` call)."""
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

    def prepare(scored_model, tokenizer, instances, *, chat: bool, batch_size: int):
        from posbias.evaluation.attention_sorting import attention_sorted  # noqa: PLC0415 (evaluation imports methods)

        return attention_sorted(scored_model, tokenizer, instances, rounds=rounds, most_attended=most_attended,
                                chat=chat, batch_size=batch_size)

    return MethodHandle("attention-sorting", model, options={"rounds": rounds, "most_attended": most_attended},
                        state={"prepare": prepare})
