"""Recognise a model's tool-call format from what its chat template renders, not from its name.

A probe conversation (one user message, one assistant turn with one structured tool call) is rendered with
the model's own template; the assistant turn's text, with special tokens removed the way a sampler decodes
them, goes to every registered parser, and the family whose parser gets back exactly the probe call is the
model's. Thinking markers and the generation prompt (Qwen3's and Qwen3.5's ``<think>``) do not matter: the
turn is what the full rendering adds to the rendering up to the generation prompt.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from mcprl_env.errors import UnknownToolCallFormatError
from mcprl_env.parsing.base import ToolCall, ToolCallParser, ToolSchemas
from mcprl_env.parsing.registry import AUTO, canonical_families, get_parser, parser_families
from mcprl_env.protocols import ChatTokenizer

__all__ = [
    "PROBE_CALL",
    "PROBE_TOOL",
    "detect_parser_family",
    "render_assistant_turn",
    "render_probe_turn",
    "resolve_parser",
]

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


def _turn_start(head: str, full: str) -> int:
    if full.startswith(head):
        return len(head)
    # The generation prompt opens something the rendered turn does not (QwQ: "<think>\n" before a turn that
    # starts "<tool_call>"): the turn starts after the last line or tag the two renderings share.
    n = 0
    while n < min(len(head), len(full)) and head[n] == full[n]:
        n += 1
    while n > 0 and full[n - 1] not in "\n>":
        n -= 1
    return n


def render_assistant_turn(
    tokenizer: ChatTokenizer,
    messages: Sequence[Mapping[str, Any]],
    *,
    tools: ToolSchemas | None = None,
    template_kwargs: Mapping[str, Any] | None = None,
) -> str:
    """The last message of ``messages`` (an assistant turn) as the template renders it, read like a sample.

    The turn is what rendering all of ``messages`` adds to rendering the ones before it with the generation
    prompt; it is encoded and decoded with ``skip_special_tokens=True``, as a sampler's text is.
    """
    kwargs = dict(template_kwargs or {})
    schemas = list(tools) if tools is not None else None
    head = tokenizer.apply_chat_template(
        list(messages[:-1]), tools=schemas, add_generation_prompt=True, tokenize=False, **kwargs
    )
    full = tokenizer.apply_chat_template(
        list(messages), tools=schemas, add_generation_prompt=False, tokenize=False, **kwargs
    )
    if not isinstance(head, str) or not isinstance(full, str):
        raise TypeError("apply_chat_template(tokenize=False) did not return text")
    turn = full[_turn_start(head, full) :]
    return tokenizer.decode(tokenizer.encode(turn, add_special_tokens=False), skip_special_tokens=True)


def render_probe_turn(tokenizer: ChatTokenizer, *, template_kwargs: Mapping[str, Any] | None = None) -> str:
    """The probe's assistant turn (one call of `PROBE_TOOL`) as the template renders it, without specials."""
    messages = [
        {"role": "user", "content": "What is the weather in Paris for 3 days?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "type": "function",
                    "function": {"name": PROBE_CALL.name, "arguments": dict(PROBE_CALL.arguments)},
                }
            ],
        },
    ]
    return render_assistant_turn(tokenizer, messages, tools=[PROBE_TOOL], template_kwargs=template_kwargs)


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
    families = [name for name, _ in canonical_families()]
    choose = (
        f"set env.parser to one of {families} (aliases: {parser_families()}) or register a parser with "
        "mcprl_env.register_parser"
    )
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
