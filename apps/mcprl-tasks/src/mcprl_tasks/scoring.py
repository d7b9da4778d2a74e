"""Scoring a demonstration script with a task's checker semantics.

The comparisons are ``mcprl_env``'s own (:func:`~mcprl_env.checkers.extract_number`,
:func:`~mcprl_env.checkers.normalize_text`, :func:`~mcprl_env.checkers.mentions`), so a demonstration
counts as a success exactly when the environment would score the same episode correct; only the
``message_posted`` state is read from the script's ``post_message`` calls instead of from the server.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from mcprl_env.checkers import extract_number, mentions, normalize_text
from mcprl_tasks.errors import TasksError

__all__ = ["Message", "demo_succeeds", "final_answer", "posted_messages"]

Message = dict[str, Any]
_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


def final_answer(messages: list[Message]) -> str | None:
    """The text inside the last assistant turn's ``<answer>`` tags (or its whole text), if it has no call."""
    if not messages or messages[-1]["role"] != "assistant" or messages[-1].get("tool_calls"):
        return None
    final = messages[-1]["content"] or ""
    match = _ANSWER.search(final)
    return (match.group(1) if match else final).strip()


def posted_messages(messages: list[Message]) -> list[tuple[str, str]]:
    """``(channel, text)`` of every ``post_message`` call in a script (structured ``tool_calls``)."""
    posts: list[tuple[str, str]] = []
    for message in messages:
        if message["role"] != "assistant":
            continue
        for call in message.get("tool_calls") or []:
            function = call["function"]
            args = function["arguments"]
            if isinstance(args, str):
                args = json.loads(args)
            if function["name"] == "post_message":
                posts.append((args["channel"].strip().lstrip("#").lower(), args["text"]))
    return posts


def demo_succeeds(task: dict[str, Any], messages: list[Message]) -> bool:
    """Whether a script satisfies the task's checker (numeric, exact, contains or message_posted)."""
    checker = task["checker"]
    if checker["type"] == "message_posted":
        return any(
            ch == checker["channel"] and mentions(text, checker["contains"])
            for ch, text in posted_messages(messages)
        )
    answer = final_answer(messages)
    if answer is None:
        return False
    expected = str(task["answer"])
    match checker["type"]:
        case "numeric":
            got = extract_number(answer)
            rel, abs_ = checker["rel_tol"], checker["abs_tol"]
            return got is not None and math.isclose(got, float(expected), rel_tol=rel, abs_tol=abs_)
        case "exact":
            return normalize_text(answer) == normalize_text(expected)
        case "contains":
            return expected.casefold() in answer.casefold()
        case other:
            raise TasksError(f"unknown checker type {other!r}")
