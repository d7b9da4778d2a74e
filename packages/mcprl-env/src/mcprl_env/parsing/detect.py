"""Recognise a model's tool-call format from what its chat template renders, not from its name.

A probe conversation (one user message, one assistant turn with one structured tool call) is rendered with
the model's own template; the assistant turn's text, with special tokens removed the way a sampler decodes
them, goes to every registered parser, and the family whose parser gets back exactly the probe call is the
model's. Thinking markers and the generation prompt (Qwen3's and Qwen3.5's ``<think>``) do not matter: the
turn is what the full rendering adds to the rendering up to the generation prompt.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mcprl_env.errors import UnknownToolCallFormatError
from mcprl_env.parsing.base import ToolCall, ToolCallParser
from mcprl_env.parsing.registry import AUTO, canonical_families, get_parser, parser_families
from mcprl_env.protocols import ChatTokenizer

__all__ = ["PROBE_CALL", "PROBE_TOOL", "detect_parser_family", "render_probe_turn", "resolve_parser"]

PROBE_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "mcprl_probe",
        "description": "Look up a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
            "required": ["city", "days"],
        },
    },
}
"""The one tool of the probe conversation."""

PROBE_CALL = ToolCall(name="mcprl_probe", arguments={"city": "Paris", "days": 3})
"""The call the probe's assistant turn makes; the right parser reads exactly this back."""


def _common_prefix(a: str, b: str) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def render_probe_turn(tokenizer: ChatTokenizer, *, template_kwargs: Mapping[str, Any] | None = None) -> str:
    """The probe's assistant turn as the template renders it, decoded without special tokens."""
    kwargs = dict(template_kwargs or {})
    user = [{"role": "user", "content": "What is the weather in Paris for 3 days?"}]
    assistant = {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {
                "type": "function",
                "function": {"name": PROBE_CALL.name, "arguments": dict(PROBE_CALL.arguments)},
            }
        ],
    }
    head = tokenizer.apply_chat_template(
        user, tools=[PROBE_TOOL], add_generation_prompt=True, tokenize=False, **kwargs
    )
    full = tokenizer.apply_chat_template(
        [*user, assistant], tools=[PROBE_TOOL], add_generation_prompt=False, tokenize=False, **kwargs
    )
    if not isinstance(head, str) or not isinstance(full, str):
        raise TypeError("apply_chat_template(tokenize=False) did not return text")
    turn = full[_common_prefix(head, full) :]
    return tokenizer.decode(tokenizer.encode(turn, add_special_tokens=False), skip_special_tokens=True)


def detect_parser_family(
    tokenizer: ChatTokenizer, *, template_kwargs: Mapping[str, Any] | None = None
) -> str:
    """The registered family whose parser reads the tool call ``tokenizer``'s chat template renders.

    Args:
        tokenizer: Chat tokenizer with the model's template.
        template_kwargs: Extra ``apply_chat_template`` arguments (``EnvConfig.chat_template_kwargs``).

    Raises:
        UnknownToolCallFormatError: The template cannot render a tool call, or renders one no registered
            parser reads; the message names ``env.parser``.
    """
    choose = f"set env.parser to one of {parser_families()} or register one with mcprl_env.register_parser"
    try:
        turn = render_probe_turn(tokenizer, template_kwargs=template_kwargs)
    except Exception as exc:
        # The template is the model vendor's code: whatever it raises means it cannot render this call.
        raise UnknownToolCallFormatError(
            f"the chat template cannot render an assistant tool call ({type(exc).__name__}: {exc}); {choose}"
        ) from exc
    if PROBE_CALL.name not in turn:
        raise UnknownToolCallFormatError(
            f"the chat template does not render tool calls (a turn calling {PROBE_CALL.name!r} rendered as "
            f"{turn[:200]!r}); {choose}"
        )
    for family, factory in canonical_families():
        parsed = factory().parse(turn, tools=[PROBE_TOOL])
        if not parsed.errors and parsed.calls == [PROBE_CALL]:
            return family
    raise UnknownToolCallFormatError(
        f"no registered parser reads the tool calls this chat template renders ({turn[:200]!r}); {choose}"
    )


def resolve_parser(
    family: str, tokenizer: ChatTokenizer, *, template_kwargs: Mapping[str, Any] | None = None
) -> ToolCallParser:
    """The parser for ``family``, or for the family `detect_parser_family` recognises when it is ``"auto"``."""
    if family.lower() == AUTO:
        family = detect_parser_family(tokenizer, template_kwargs=template_kwargs)
    return get_parser(family)
