"""The one spelling of the ways of scoring an answer (records, configs, command lines): teacher-forced,
greedy generation, or both from one prefill; and which commands take which."""
from __future__ import annotations

TEACHER_FORCED, GENERATE, BOTH = "teacher-forced", "generate", "both"
EVAL_MODES = (TEACHER_FORCED, GENERATE, BOTH)  # posbias eval / compare
GRID_MODES = (TEACHER_FORCED, GENERATE)  # a study's length grid scores either or both, listed
MAP_MODES = (TEACHER_FORCED, BOTH)  # posbias map: teacher-forced, and greedy generation on the wrong answers
_MODE_ALIASES = {"teacher_forced": TEACHER_FORCED, "tf": TEACHER_FORCED, "generation": GENERATE}


def canonical_mode(name: str) -> str:
    """``"teacher-forced"`` or ``"generate"`` for any accepted spelling (``teacher_forced``, ``tf``, ...);
    other names are returned unchanged for the caller to refuse."""
    name = str(name).strip().lower()
    return _MODE_ALIASES.get(name, name)
