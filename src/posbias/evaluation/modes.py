"""The one spelling of the two ways of scoring an answer (records, configs, command lines)."""
from __future__ import annotations

TEACHER_FORCED, GENERATE = "teacher-forced", "generate"
_MODE_ALIASES = {"teacher_forced": TEACHER_FORCED, "tf": TEACHER_FORCED, "generation": GENERATE}


def canonical_mode(name: str) -> str:
    """``"teacher-forced"`` or ``"generate"`` for any accepted spelling (``teacher_forced``, ``tf``, ...);
    other names are returned unchanged for the caller to refuse."""
    name = str(name).strip().lower()
    return _MODE_ALIASES.get(name, name)
