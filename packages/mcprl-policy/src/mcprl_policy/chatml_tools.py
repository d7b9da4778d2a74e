"""A ChatML chat template with Hermes/Qwen2.5-style tool calls, for chat models whose template has no tools.

Many small ChatML chat models (SmolLM2, ...) ship a template that renders roles and content only. The template
here (package data ``templates/chatml_tools.jinja``, adapted from Qwen2.5-Instruct's, Apache-2.0) adds the
format a user would pick for such a model, because it is the most widely trained and served one: the tools' JSON
schemas in a ``<tools>`` block of the system turn, each call as ``<tool_call>\\n{"name": ..., "arguments":
{...}}\\n</tool_call>`` in the assistant turn, and the results as ``<tool_response>`` blocks in a user turn.
``mcprl_env``'s parser detection recognises it as ``hermes``. The tags need not be special tokens: a vocabulary
without them spells them in ordinary text tokens, which the parser reads the same way; a turn still ends with
``<|im_end|>``, the ChatML end-of-turn token such a model already has.
"""

from __future__ import annotations

import functools
import json
from importlib import resources
from typing import Final

__all__ = ["DEFAULT_SYSTEM_PROMPT", "chatml_tool_template"]

DEFAULT_SYSTEM_PROMPT: Final = "You are a helpful assistant."
"""The system prompt the template renders when the conversation has none (a model's own may replace it)."""

_SYSTEM_LINE: Final = '{%- set default_system = "You are a helpful assistant." %}'


@functools.cache
def _raw_template() -> str:
    text = resources.files("mcprl_policy").joinpath("templates", "chatml_tools.jinja").read_text("utf-8")
    if text.count(_SYSTEM_LINE) != 1:
        raise RuntimeError(
            f"templates/chatml_tools.jinja has no line {_SYSTEM_LINE!r} to set the system prompt"
        )
    return text


def chatml_tool_template(default_system_prompt: str = DEFAULT_SYSTEM_PROMPT) -> str:
    """The ChatML tool template, rendering ``default_system_prompt`` when a conversation has no system message.

    Args:
        default_system_prompt: e.g. the model's own default (SmolLM2's names itself), so that a conversation
            without a system message starts as the model was trained to see it.

    Returns:
        Jinja source for ``tokenizer.chat_template`` (saved beside a model as ``chat_template.jinja``).
    """
    # A JSON string literal is a valid Jinja string literal with the same value.
    literal = json.dumps(default_system_prompt, ensure_ascii=False)
    return _raw_template().replace(_SYSTEM_LINE, "{%- set default_system = " + literal + " %}")
