"""Seeded long-context task generators.

    from posbias.tasks import make_instances, TASKS, apply_chat, prompt_tokens
    make_instances("kv", n=20, depths=[0, 0.5, 1], seed=0, split="eval", num_keys=30)

Tasks: ``kv``, ``kv-uuid``, ``mdqa``, ``passkey``, ``niah`` (see :data:`TASKS` for the options
and their defaults).
"""
from posbias.tasks.base import Instance, depth_to_index
from posbias.tasks.chat import apply_chat, prompt_tokens
from posbias.tasks.kv import WORDS
from posbias.tasks.registry import (
                                    TASKS,
                                    TaskSpec,
                                    check_length,
                                    check_request,
                                    make_instances,
                                    precheck_instances,
                                    supports_shared_context,
)

__all__ = ["Instance", "TASKS", "TaskSpec", "WORDS", "apply_chat", "check_length", "check_request", "depth_to_index",
           "make_instances", "precheck_instances", "prompt_tokens", "supports_shared_context"]
