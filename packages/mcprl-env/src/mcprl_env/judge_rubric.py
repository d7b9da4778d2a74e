"""The LLM judge's rubric and verdict: what is sent (`SYSTEM_PROMPT`, a rubric template) and what is accepted.

A rubric is a `string.Template`, sent as the user message, that places ``$answer`` and may place ``$prompt``,
``$reference`` (the task's answer), ``$tool_calls`` (`render_tool_calls`) and ``$task_id``; ``$$`` is a dollar
sign. The verdict rule is strict: the reply (an optional leading ``<think>…</think>`` block and an optional
Markdown code fence removed) must be exactly one JSON object ``{"correct": <bool>, "reason": <str>}``.
"""

from __future__ import annotations

import json
import re
import string

import attrs

from mcprl_env.errors import ConfigError
from mcprl_env.finished import ToolCallRecord

__all__ = [
    "DEFAULT_RUBRIC",
    "PLACEHOLDERS",
    "SYSTEM_PROMPT",
    "Verdict",
    "check_rubric",
    "parse_verdict",
    "render_tool_calls",
]

SYSTEM_PROMPT = (
    "You grade an AI assistant's answer to a task against the grader's criteria. Reply with exactly one JSON "
    'object and nothing else: {"correct": true or false, "reason": "<one sentence>"}.'
)
"""The system message of every request: it fixes the verdict format `parse_verdict` accepts."""

DEFAULT_RUBRIC = """\
Decide whether the assistant's final answer correctly and completely answers the task.

Task:
$prompt

Reference answer (may be empty): $reference

Assistant's final answer:
$answer
"""
"""A rubric that compares the answer with the task's reference answer."""

PLACEHOLDERS = frozenset({"prompt", "reference", "answer", "tool_calls", "task_id"})
_THINK = re.compile(r"\A\s*<think>.*?</think>", re.DOTALL)
_FENCE = re.compile(r"\A```(?:json)?\s*\n?(.*?)\n?```\Z", re.DOTALL)


@attrs.frozen(kw_only=True)
class Verdict:
    """A judge's verdict on one answer."""

    correct: bool
    reason: str


def parse_verdict(content: str) -> Verdict:
    """The verdict in a judge's reply, by the strict rule of `mcprl_env.judge_rubric`.

    Raises:
        ValueError: The reply is not exactly ``{"correct": bool, "reason": str}`` (the message says why).
    """
    text = _THINK.sub("", content, count=1).strip()
    fenced = _FENCE.match(text)
    if fenced is not None:
        text = fenced.group(1).strip()
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not one JSON object ({exc.msg} at char {exc.pos}): {content[:200]!r}") from None
    if not isinstance(value, dict):
        raise ValueError(f"a JSON {type(value).__name__}, not an object: {content[:200]!r}")
    keys = set(value)  # pyright: ignore[reportUnknownArgumentType]
    if keys != {"correct", "reason"}:
        raise ValueError(f"keys {sorted(keys)} (expected exactly 'correct' and 'reason'): {content[:200]!r}")
    correct, reason = value["correct"], value["reason"]  # pyright: ignore[reportUnknownVariableType]
    if not isinstance(correct, bool) or not isinstance(reason, str):
        raise ValueError(f"'correct' must be true/false and 'reason' a string: {content[:200]!r}")
    return Verdict(correct=correct, reason=reason)


def render_tool_calls(calls: tuple[ToolCallRecord, ...], limit: int) -> str:
    """``$tool_calls``: one line per call, each result cut at ``limit`` characters."""
    lines: list[str] = []
    for i, call in enumerate(calls, 1):
        status = "ok" if call.ok else f"error ({call.error_type})"
        result = call.result if len(call.result) <= limit else call.result[:limit] + " …[truncated]"
        lines.append(
            f"{i}. {call.name}({json.dumps(dict(call.arguments), sort_keys=True)}) -> {status}: {result}"
        )
    return "\n".join(lines) or "(no tool calls)"


def check_rubric(rubric: str) -> None:
    """Refuse a rubric that is not a valid template of the known placeholders with ``$answer`` among them.

    Raises:
        ConfigError: Naming the problem.
    """
    template = string.Template(rubric)
    if not template.is_valid():
        raise ConfigError("judge rubric: a '$' that starts no placeholder (write '$$' for a dollar sign)")
    names = set(template.get_identifiers())
    if unknown := names - PLACEHOLDERS:
        raise ConfigError(
            f"judge rubric: unknown placeholder(s) {sorted(unknown)}; known: {sorted(PLACEHOLDERS)}"
        )
    if "answer" not in names:
        raise ConfigError("judge rubric: it must place the answer ($answer)")
