"""What every tool-call parser shares: the parsed types, the protocol, and the pieces of a turn around calls.

A parser turns one assistant turn's text (special tokens already removed) into calls and typed parse errors,
in order. A malformed call is the model's fault: it is returned as a `ToolCallParseError` item, never raised.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import attrs

from mcprl_env.errors import ToolCallParseError

__all__ = ["ParsedTurn", "ToolCall", "ToolCallParser", "ToolSchemas"]

ToolSchemas = Sequence[Mapping[str, Any]]
"""Chat-template tool schemas (``{"type": "function", "function": {"name", "parameters"}}``)."""

_THINK_BLOCK = re.compile(r"<think>.*?</think>", re.DOTALL)
_ANSWER = re.compile(r"<answer>(.*?)(?:</answer>|\Z)", re.DOTALL)
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
        answer: For a final turn (no tool-call attempt at all): the text inside ``<answer>...</answer>`` when
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
        """A turn with no tool-call attempt (well-formed or not) is the episode's final answer."""
        return not self.items


class ToolCallParser(Protocol):
    """Turns an assistant turn's text into calls, errors and an answer."""

    def parse(self, text: str, *, tools: ToolSchemas | None = None) -> ParsedTurn:
        """Parse one assistant turn.

        Args:
            text: The turn's text, special tokens removed.
            tools: The schemas the prompt offered; formats whose arguments are untyped text (Qwen3.5 XML)
                read each argument's type from them. JSON formats ignore them.
        """
        ...


def split_thinking(text: str) -> tuple[str, str | None]:
    """``(visible text, thinking)``: think blocks taken out of ``text`` (None when there were none)."""
    thoughts = [m.group(0)[len("<think>") : -len("</think>")] for m in _THINK_BLOCK.finditer(text)]
    visible = _THINK_BLOCK.sub("", text)
    if "</think>" in visible:
        # Generation prompts that open the think block (Qwen3, Qwen3.5) leave only the closing tag in the
        # completion.
        head, _, visible = visible.rpartition("</think>")
        thoughts.insert(0, head.replace("<think>", ""))
    if "<think>" in visible:
        # An unclosed think block runs to the end of the turn: nothing after it is visible.
        visible, _, tail = visible.partition("<think>")
        thoughts.append(tail)
    return visible, ("".join(thoughts) if thoughts else None)


def make_turn(
    items: Sequence[ToolCall | ToolCallParseError], content: str, thinking: str | None
) -> ParsedTurn:
    """The parsed turn; a turn without any call attempt gets its answer."""
    content = content.strip()
    answer: str | None = None
    if not items:
        found = _ANSWER.findall(content)
        answer = found[-1].strip() if found else content
    return ParsedTurn(items=tuple(items), content=content, thinking=thinking, answer=answer)


def scan_tagged_calls(
    visible: str,
    *,
    open_tag: str,
    close_tag: str,
    parse_body: Callable[[str], ToolCall | ToolCallParseError],
) -> tuple[list[ToolCall | ToolCallParseError], str]:
    """Calls between ``open_tag`` and ``close_tag`` in ``visible``, and the text outside them.

    Unopened, unclosed and nested tags are typed errors; each well-formed block's body goes to
    ``parse_body``.
    """
    tags = re.compile(f"{re.escape(open_tag)}|{re.escape(close_tag)}")
    items: list[ToolCall | ToolCallParseError] = []
    outside: list[str] = []
    pos = 0
    open_at: int | None = None
    depth = 0
    nested = False
    for match in tags.finditer(visible):
        if match.group(0) == open_tag:
            if depth == 0:
                outside.append(visible[pos : match.start()])
                open_at = match.end()
            else:
                nested = True
            depth += 1
        elif depth == 0:
            items.append(
                ToolCallParseError(
                    "unopened_tag", f"{close_tag} without an opening {open_tag}", raw=visible[pos:]
                )
            )
            outside.append(visible[pos : match.start()])
            pos = match.end()
        else:
            depth -= 1
            if depth == 0:
                assert open_at is not None
                body = visible[open_at : match.start()]
                if nested:
                    items.append(
                        ToolCallParseError(
                            "nested_tag", f"{open_tag} opened inside another {open_tag}", raw=body
                        )
                    )
                else:
                    items.append(parse_body(body))
                open_at, nested, pos = None, False, match.end()
    if open_at is not None:
        kind = "nested_tag" if nested else "unclosed_tag"
        items.append(ToolCallParseError(kind, f"{open_tag} is never closed", raw=visible[open_at:]))
    else:
        outside.append(visible[pos:])
    return items, "".join(outside)


def too_large(body: str, limit: int) -> ToolCallParseError | None:
    """A ``too_large`` error when ``body`` is longer than ``limit`` characters."""
    if len(body) > limit:
        return ToolCallParseError(
            "too_large", f"tool call is {len(body)} characters (limit {limit})", raw=body
        )
    return None


def decode_json_object(text: str, raw: str, *, where: str) -> tuple[dict[str, Any], int] | ToolCallParseError:
    """The JSON object at the start of ``text`` and where it ends, or the typed error."""
    try:
        value, end = json.JSONDecoder().raw_decode(text)
    except json.JSONDecodeError as exc:
        return ToolCallParseError("invalid_json", f"invalid JSON: {exc.msg} at char {exc.pos}", raw=raw)
    except RecursionError:
        return ToolCallParseError("invalid_json", "invalid JSON: nested too deeply", raw=raw)
    except ValueError as exc:  # e.g. an integer literal past Python's int-from-string digit limit
        return ToolCallParseError("invalid_json", f"invalid JSON: {exc}", raw=raw)
    if not isinstance(value, dict):
        return ToolCallParseError(
            "not_an_object", f"expected a JSON object {where}, got {type(value).__name__}", raw=raw
        )
    return value, end


def call_from_object(value: Mapping[str, Any], raw: str) -> ToolCall | ToolCallParseError:
    """A call from ``{"name": ..., "arguments" | "parameters": {...}}`` (arguments may be a JSON string)."""
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
        except (ValueError, RecursionError):  # ValueError: JSONDecodeError, or a too-long integer literal
            return ToolCallParseError(
                "invalid_arguments", "'arguments' is a string that is not JSON", raw=raw
            )
    if not isinstance(arguments, dict):
        return ToolCallParseError(
            "invalid_arguments", f"'arguments' must be an object, got {type(arguments).__name__}", raw=raw
        )
    return ToolCall(name=name.strip(), arguments=arguments)
