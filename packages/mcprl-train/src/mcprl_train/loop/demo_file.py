"""Demonstrations from a JSONL file of chat messages, the format OpenAI's and Hugging Face's fine-tuning tools use.

Each line is one demonstration of one training task::

    {"task_id": "q-17", "messages": [...], "tools": [...]}

``messages`` are OpenAI chat messages: ``system``/``user`` text, ``assistant`` turns with optional structured
``tool_calls`` (``{"type": "function", "function": {"name": ..., "arguments": {...} or "<JSON object>"}}``) and
an optional ``"weight": 0`` (context, not a target), and ``tool`` results (``content``, optional ``name`` and
``tool_call_id``). ``tools`` (optional) are the schemas the demonstration was written against; the warm start
renders every demonstration with the schemas the environment gives the task, so the tokens it imitates are the
tokens the model will sample, and checks every call against them (`render_demonstrations`).

Everything that can be checked without the tool servers is checked here, at start-up, with the line number:
malformed JSON, an unknown task id, a message the chat format does not allow, a call naming a tool the line's
own ``tools`` lack, a conversation without an assistant turn to train on.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Collection
from pathlib import Path
from typing import Any, cast

import attrs

from mcprl_train.errors import DemonstrationError

__all__ = ["Demonstration", "read_demo_file"]

_ROLES = frozenset({"system", "user", "assistant", "tool"})


@attrs.frozen(kw_only=True)
class Demonstration:
    """One warm-start demonstration.

    Attributes:
        task_id: The training task it demonstrates (its tool schemas and template arguments render it).
        messages: Chat messages (assistant tool calls as structured ``tool_calls``, arguments as objects).
        succeeds: Whether it solves the task by the task's checker; None when nobody scored it (a file).
        source: Where it came from, for errors (``demos.jsonl:12`` or ``scripted``).
    """

    task_id: str
    messages: list[dict[str, Any]]
    succeeds: bool | None
    source: str


def read_demo_file(path: Path, task_ids: Collection[str]) -> list[Demonstration]:
    """Read and check every line of a demonstrations file (blank lines are skipped).

    Args:
        path: The JSONL file.
        task_ids: The training set's task ids.

    Raises:
        FileNotFoundError: ``path`` does not exist.
        DemonstrationError: naming ``path:line`` and the problem; the file has no demonstration.
    """
    if not path.is_file():
        raise FileNotFoundError(f"sft.demos_path: no such file: {str(path)!r}")
    out: list[Demonstration] = []
    with path.open(encoding="utf-8") as f:
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            where = f"{path}:{number}"
            try:
                out.append(_demonstration(line, task_ids, where))
            except DemonstrationError as e:
                raise DemonstrationError(f"{where}: {e}") from e
    if not out:
        raise DemonstrationError(f"{path}: the demonstrations file is empty")
    return out


def _demonstration(line: str, task_ids: Collection[str], where: str) -> Demonstration:
    try:
        record: object = json.loads(line)
    except json.JSONDecodeError as e:
        raise DemonstrationError(f"malformed JSON: {e}") from e
    if not isinstance(record, dict):
        raise DemonstrationError(f"expected a JSON object, got {type(record).__name__}")
    obj = cast("dict[str, object]", record)
    unknown = sorted(set(obj) - {"task_id", "messages", "tools"})
    if unknown:
        raise DemonstrationError(f"unknown key(s) {unknown}; a line holds task_id, messages and tools")
    task_id = obj.get("task_id")
    if not isinstance(task_id, str | int) or isinstance(task_id, bool):
        raise DemonstrationError(f"task_id must be a string, got {task_id!r}")
    task_id = str(task_id)
    if task_id not in task_ids:
        near = difflib.get_close_matches(task_id, list(task_ids), n=1)
        hint = f" (did you mean {near[0]!r}?)" if near else ""
        raise DemonstrationError(f"unknown task id {task_id!r}: no such task in the training set{hint}")
    tool_names = _tool_names(obj.get("tools"))
    messages = obj.get("messages")
    if not isinstance(messages, list) or not messages:
        raise DemonstrationError("messages must be a non-empty list of chat messages")
    checked = [_message(m, i, tool_names) for i, m in enumerate(cast("list[object]", messages))]
    if not any(m["role"] == "assistant" and m.get("weight", 1) != 0 for m in checked):
        raise DemonstrationError(
            "no assistant turn to train on (every assistant message is missing or weight 0)"
        )
    return Demonstration(task_id=task_id, messages=checked, succeeds=None, source=where)


def _tool_names(tools: object) -> frozenset[str] | None:
    """The names of a line's ``tools`` schemas, or None when the line gives none."""
    if tools is None:
        return None
    if not isinstance(tools, list):
        raise DemonstrationError("tools must be a list of tool schemas")
    names: set[str] = set()
    for i, schema in enumerate(cast("list[object]", tools)):
        function = cast("dict[str, object]", schema).get("function") if isinstance(schema, dict) else None
        name = cast("dict[str, object]", function).get("name") if isinstance(function, dict) else None
        if not isinstance(name, str):
            raise DemonstrationError(
                f"tools[{i}]: expected {{'type': 'function', 'function': {{'name': ...}}}}"
            )
        names.add(name)
    return frozenset(names)


def _message(message: object, i: int, tool_names: frozenset[str] | None) -> dict[str, Any]:
    if not isinstance(message, dict):
        raise DemonstrationError(f"messages[{i}]: expected a JSON object, got {type(message).__name__}")
    m = dict(cast("dict[str, Any]", message))
    role = m.get("role")
    if role not in _ROLES:
        raise DemonstrationError(f"messages[{i}]: role must be one of {sorted(_ROLES)}, got {role!r}")
    content = m.get("content")
    if not (content is None or isinstance(content, str | list)):
        raise DemonstrationError(f"messages[{i}]: content must be a string, a list of parts or null")
    if role != "assistant":
        if "tool_calls" in m or "weight" in m:
            raise DemonstrationError(f"messages[{i}]: only assistant messages have tool_calls or a weight")
        if content is None:
            raise DemonstrationError(f"messages[{i}] ({role}): content is missing")
        return m
    calls = m.get("tool_calls")
    if calls is not None:
        if not isinstance(calls, list):
            raise DemonstrationError(f"messages[{i}]: tool_calls must be a list")
        m["tool_calls"] = [
            _call(c, f"messages[{i}].tool_calls[{j}]", tool_names)
            for j, c in enumerate(cast("list[object]", calls))
        ]
    elif content is None:
        raise DemonstrationError(f"messages[{i}] (assistant): neither content nor tool_calls")
    return m


def _call(call: object, where: str, tool_names: frozenset[str] | None) -> dict[str, Any]:
    """A structured call with its arguments as an object (templates that render arguments one by one, as
    Qwen3.5's XML does, need the object; a JSON-string ``arguments`` is parsed)."""
    c = cast("dict[str, Any]", call) if isinstance(call, dict) else None
    function: object = c.get("function") if c is not None else None
    if c is None or not isinstance(function, dict) or c.get("type", "function") != "function":
        raise DemonstrationError(
            f"{where}: expected {{'type': 'function', 'function': {{'name', 'arguments'}}}}"
        )
    fn = cast("dict[str, Any]", function)
    name = fn.get("name")
    if not isinstance(name, str) or not name:
        raise DemonstrationError(f"{where}: the function has no name")
    if tool_names is not None and name not in tool_names:
        raise DemonstrationError(f"{where}: unknown tool {name!r}; the line's tools are {sorted(tool_names)}")
    arguments: object = fn.get("arguments", {})
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError as e:
            raise DemonstrationError(f"{where}: arguments of {name!r} are not valid JSON: {e}") from e
    if not isinstance(arguments, dict):
        raise DemonstrationError(f"{where}: arguments of {name!r} must be a JSON object")
    return {**c, "type": "function", "function": {**fn, "arguments": arguments}}
