"""Chat-template wrapping and token counting shared by the task generators and the scorers."""
from __future__ import annotations

from typing import Any


def has_chat_template(tokenizer: Any) -> bool:
    return tokenizer is not None and bool(getattr(tokenizer, "chat_template", None))


def apply_chat(tokenizer: Any, prompt: str, answer_prefix: str = "") -> str:
    """The text the model sees before its answer.

    With a chat template: the prompt as one user turn, ``add_generation_prompt=True``, then
    ``answer_prefix`` appended directly (the template already ends the assistant header).
    Without one (or ``tokenizer=None``): the raw prompt, then ``" " + answer_prefix`` when a
    prefix is given (e.g. ``"... What is the pass key? The pass key is"``).
    """
    if has_chat_template(tokenizer):
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True
        )
        if not isinstance(text, str):  # some versions return a list for batched input
            text = text[0]
        return text + answer_prefix
    return plain_prompt(prompt, answer_prefix)


def plain_prompt(prompt: str, answer_prefix: str = "") -> str:
    """The raw prompt followed by ``" " + answer_prefix`` when a prefix is given (no chat template)."""
    return prompt + (" " + answer_prefix if answer_prefix else "")


def prompt_tokens(tokenizer: Any, text: str) -> int:
    """Number of tokens of ``text`` (no special tokens added; a chat template carries its own)."""
    if tokenizer is None:
        raise ValueError("prompt_tokens needs a tokenizer")
    return len(tokenizer(text, add_special_tokens=False)["input_ids"])
