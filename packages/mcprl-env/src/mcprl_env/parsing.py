"""Tool-call parsers per model family, starting with Hermes/Qwen ``<tool_call>{json}</tool_call>``.

Tolerant where a user would expect it (whitespace around tags and JSON, text before and after calls,
``<think>`` blocks, a JSON-string ``arguments`` that decodes to an object, ``parameters`` for ``arguments``);
strict where a guess could corrupt training (unclosed or nested tags, trailing text inside a tag, JSON that is
not an object, a missing name, arguments that are not an object, unknown keys). Every failure is a typed
`ToolCallParseError` with a kind, kept in order with the calls so the episode can answer each one.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any, Protocol

import attrs

from mcprl_env.errors import ToolCallParseError

__all__ = [
    "HermesToolCallParser",
    "ParsedTurn",
    "ToolCall",
    "ToolCallParser",
    "get_parser",
    "parser_families",
    "register_parser",
]

_THINK_BLOCK = re.compile(r"<think>.*?</think>", re.DOTALL)
_ANSWER = re.compile(r"<answer>(.*?)(?:</answer>|\Z)", re.DOTALL)
_TAG = re.compile(r"</?tool_call>")
_CALL_KEYS = frozenset({"name", "arguments", "parameters"})


@attrs.frozen(kw_only=True)
class ToolCall:
    """One parsed tool call: the exposed tool name and its JSON-object arguments."""

    name: str
    arguments: dict[str, Any]


@attrs.frozen(kw_only=True)
class ParsedTurn:
    """One assistant turn, parsed.

    Attributes:
        items: Calls and parse errors in the order they appear in the turn.
        content: The turn's text without think blocks and without tool-call blocks, stripped.
        thinking: Text of the think blocks, or None when there were none.
        answer: For a final turn (no tool-call tags at all): the text inside ``<answer>...</answer>`` when
            present, else ``content``. None for a turn that tries to call tools.
    """

    items: tuple[ToolCall | ToolCallParseError, ...]
    content: str
    thinking: str | None
    answer: str | None

    @property
    def calls(self) -> list[ToolCall]:
        """The well-formed calls."""
        return [item for item in self.items if isinstance(item, ToolCall)]

    @property
    def errors(self) -> list[ToolCallParseError]:
        """The parse errors."""
        return [item for item in self.items if isinstance(item, ToolCallParseError)]

    @property
    def is_final(self) -> bool:
        """A turn with no tool-call tags (well-formed or not) is the episode's final answer."""
        return not self.items


class ToolCallParser(Protocol):
    """Turns an assistant turn's text into calls, errors and an answer."""

    def parse(self, text: str) -> ParsedTurn:
        """Parse one assistant turn."""
        ...


def _split_thinking(text: str) -> tuple[str, str | None]:
    thoughts = [m.group(0)[len("<think>") : -len("</think>")] for m in _THINK_BLOCK.finditer(text)]
    visible = _THINK_BLOCK.sub("", text)
    if "</think>" in visible:
        # Generation prompts that open the think block (Qwen3) leave only the closing tag in the completion.
        head, _, visible = visible.rpartition("</think>")
        thoughts.insert(0, head.replace("<think>", ""))
    if "<think>" in visible:
        # An unclosed think block runs to the end of the turn: nothing after it is visible.
        visible, _, tail = visible.partition("<think>")
        thoughts.append(tail)
    return visible, ("".join(thoughts) if thoughts else None)


@attrs.frozen(kw_only=True)
class HermesToolCallParser:
    """Hermes/Qwen-style ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` parser.

    Args:
        max_call_chars: Longest call body parsed; longer bodies are a ``too_large`` error (a 10 MB argument
            never reaches ``json.loads``).
    """

    max_call_chars: int = attrs.field(default=65_536, validator=attrs.validators.gt(0))

    def parse(self, text: str) -> ParsedTurn:
        """Parse one assistant turn's text (special tokens already removed)."""
        visible, thinking = _split_thinking(text)
        items: list[ToolCall | ToolCallParseError] = []
        outside: list[str] = []
        pos = 0
        open_at: int | None = None
        depth = 0
        nested = False
        for match in _TAG.finditer(visible):
            if match.group(0) == "<tool_call>":
                if depth == 0:
                    outside.append(visible[pos : match.start()])
                    open_at = match.end()
                else:
                    nested = True
                depth += 1
            elif depth == 0:
                items.append(
                    ToolCallParseError(
                        "unopened_tag", "</tool_call> without an opening <tool_call>", raw=visible[pos:]
                    )
                )
                outside.append(visible[pos : match.start()])
                pos = match.end()
            else:
                depth -= 1
                if depth == 0:
                    assert open_at is not None
                    if nested:
                        items.append(
                            ToolCallParseError(
                                "nested_tag",
                                "<tool_call> opened inside another <tool_call>",
                                raw=visible[open_at : match.start()],
                            )
                        )
                    else:
                        items.append(self._parse_body(visible[open_at : match.start()]))
                    open_at, nested, pos = None, False, match.end()
        if open_at is not None:
            kind = "nested_tag" if nested else "unclosed_tag"
            items.append(ToolCallParseError(kind, "<tool_call> is never closed", raw=visible[open_at:]))
        else:
            outside.append(visible[pos:])
        content = "".join(outside).strip()
        answer: str | None = None
        if not items:
            found = _ANSWER.findall(content)
            answer = found[-1].strip() if found else content
        return ParsedTurn(items=tuple(items), content=content, thinking=thinking, answer=answer)

    def _parse_body(self, body: str) -> ToolCall | ToolCallParseError:
        if len(body) > self.max_call_chars:
            return ToolCallParseError(
                "too_large", f"tool call is {len(body)} characters (limit {self.max_call_chars})", raw=body
            )
        stripped = body.strip()
        if not stripped:
            return ToolCallParseError("empty_call", "empty <tool_call></tool_call>", raw=body)
        try:
            value, end = json.JSONDecoder().raw_decode(stripped)
        except json.JSONDecodeError as exc:
            return ToolCallParseError("invalid_json", f"invalid JSON: {exc.msg} at char {exc.pos}", raw=body)
        except RecursionError:
            return ToolCallParseError("invalid_json", "invalid JSON: nested too deeply", raw=body)
        if stripped[end:].strip():
            return ToolCallParseError(
                "invalid_json", "text after the JSON object inside <tool_call>", raw=body
            )
        if not isinstance(value, dict):
            return ToolCallParseError(
                "not_an_object", f"expected a JSON object, got {type(value).__name__}", raw=body
            )
        return _call_from_object(value, body)


def _call_from_object(value: dict[str, Any], raw: str) -> ToolCall | ToolCallParseError:
    extra = sorted(set(value) - _CALL_KEYS)
    if extra:
        return ToolCallParseError(
            "unexpected_keys", f"unexpected keys {extra}; use name and arguments", raw=raw
        )
    if "arguments" in value and "parameters" in value:
        return ToolCallParseError("unexpected_keys", "both 'arguments' and 'parameters' given", raw=raw)
    name = value.get("name")
    if name is None:
        return ToolCallParseError("missing_name", "tool call has no 'name'", raw=raw)
    if not isinstance(name, str) or not name.strip():
        return ToolCallParseError("invalid_name", "'name' must be a non-empty string", raw=raw)
    arguments: Any = value.get("arguments", value.get("parameters", {}))
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except (json.JSONDecodeError, RecursionError):
            return ToolCallParseError(
                "invalid_arguments", "'arguments' is a string that is not JSON", raw=raw
            )
    if not isinstance(arguments, dict):
        return ToolCallParseError(
            "invalid_arguments", f"'arguments' must be an object, got {type(arguments).__name__}", raw=raw
        )
    return ToolCall(name=name.strip(), arguments=arguments)


_REGISTRY: dict[str, Callable[[], ToolCallParser]] = {
    "hermes": HermesToolCallParser,
    "qwen": HermesToolCallParser,
    "qwen2": HermesToolCallParser,
    "qwen2.5": HermesToolCallParser,
    "qwen3": HermesToolCallParser,
}


def register_parser(family: str, factory: Callable[[], ToolCallParser]) -> None:
    """Register (or replace) the parser used for a model family."""
    _REGISTRY[family.lower()] = factory


def parser_families() -> list[str]:
    """Model families with a registered parser."""
    return sorted(_REGISTRY)


def get_parser(family: str) -> ToolCallParser:
    """A new parser for ``family`` (e.g. ``"hermes"``, ``"qwen3"``).

    Raises:
        KeyError: No parser is registered for ``family``; the message lists the known families.
    """
    try:
        factory = _REGISTRY[family.lower()]
    except KeyError:
        raise KeyError(
            f"no tool-call parser for model family {family!r}; known: {parser_families()}"
        ) from None
    return factory()
