"""Tasks: what an episode is asked to do, which tools it may use and how its answer is checked.

The JSON shape is documented in ``docs/INTERFACES.md`` ("Tasks"). `task_from_dict` validates one object and
names the offending field; the loaders in `mcprl_env.loaders` add the file, line and item index.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, get_args

import attrs

from mcprl_env.errors import TaskValidationError, UserCodeImportError
from mcprl_env.user_code import UserFunction, load_user_function

__all__ = [
    "Checker",
    "ContainsChecker",
    "Difficulty",
    "ExactChecker",
    "MessagePostedChecker",
    "NumericChecker",
    "PythonChecker",
    "Task",
    "checker_from_dict",
    "checker_to_dict",
    "task_from_dict",
]

Difficulty = Literal["easy", "medium", "hard"]
_DIFFICULTIES: tuple[str, ...] = get_args(Difficulty)
_ROLES = frozenset({"system", "user", "assistant", "tool"})


@attrs.frozen(kw_only=True)
class ExactChecker:
    """Whitespace- and case-normalised string equality with the task's answer."""

    type: Literal["exact"] = "exact"


@attrs.frozen(kw_only=True)
class NumericChecker:
    """``math.isclose(float(answer_given), float(task.answer), rel_tol=..., abs_tol=...)``."""

    type: Literal["numeric"] = "numeric"
    rel_tol: float = attrs.field(default=1e-6, validator=attrs.validators.ge(0.0))
    abs_tol: float = attrs.field(default=0.0, validator=attrs.validators.ge(0.0))


@attrs.frozen(kw_only=True)
class ContainsChecker:
    """The task's answer is a case-insensitive substring of the given answer."""

    type: Literal["contains"] = "contains"


@attrs.frozen(kw_only=True)
class MessagePostedChecker:
    """State check: a message containing ``contains`` was posted to ``channel`` during the episode."""

    type: Literal["message_posted"] = "message_posted"
    channel: str = attrs.field(validator=attrs.validators.min_len(1))
    contains: str = attrs.field(validator=attrs.validators.min_len(1))
    server: str = "messaging"


@attrs.frozen(kw_only=True)
class PythonChecker:
    """A user's function judges the whole episode (`mcprl_env.FinishedEpisode`) and returns True or False.

    ``function`` is ``file.py:name`` (a path relative to the task file's directory) or
    ``package.module:name``; it is imported when the task is validated, so a typo fails at start-up.

    Attributes:
        function: The spec as written in the task file.
        resolved: The imported function.
    """

    type: Literal["python"] = "python"
    function: str = attrs.field(validator=attrs.validators.min_len(1))
    resolved: UserFunction = attrs.field(repr=False)  # compared by spec and origin, not by identity


Checker = ExactChecker | NumericChecker | ContainsChecker | MessagePostedChecker | PythonChecker

_CHECKER_FIELDS: dict[str, tuple[str, ...]] = {
    "exact": ("type",),
    "numeric": ("type", "rel_tol", "abs_tol"),
    "contains": ("type",),
    "message_posted": ("type", "server", "channel", "contains"),
    "python": ("type", "function"),
}


@attrs.frozen(kw_only=True)
class Task:
    """One task.

    Attributes:
        id: Unique task id (episode ids derive from it).
        prompt: The user prompt (when ``messages`` is not given).
        system: Optional system prompt placed before ``prompt``.
        messages: Explicit opening conversation (instead of ``prompt``/``system``).
        servers: Servers whose tools the task may use (None: every server).
        tools: Optional allow-list of exposed tool names (or ``server.tool`` names).
        difficulty: ``easy`` | ``medium`` | ``hard`` (sets the default turn limit).
        answer: Expected answer for the exact/numeric/contains checkers (optional for ``python`` ones).
        checker: How the final answer (or the servers' state) is checked.
        max_turns: Turn limit overriding the difficulty default.
        metadata: Free-form data carried along (family, min_tool_calls, ...).
    """

    id: str
    prompt: str | None = None
    system: str | None = None
    messages: tuple[dict[str, Any], ...] = ()
    servers: tuple[str, ...] | None = None
    tools: tuple[str, ...] | None = None
    difficulty: Difficulty = "easy"
    answer: str | None = None
    checker: Checker = attrs.field(factory=ExactChecker)
    max_turns: int | None = None
    metadata: dict[str, Any] = attrs.field(factory=dict)

    def initial_messages(self) -> list[dict[str, Any]]:
        """The conversation an episode starts from (fresh copies)."""
        if self.messages:
            return [dict(m) for m in self.messages]
        out: list[dict[str, Any]] = []
        if self.system:
            out.append({"role": "system", "content": self.system})
        out.append({"role": "user", "content": self.prompt or ""})
        return out

    def to_dict(self) -> dict[str, Any]:
        """The task as a JSON-ready dict (the file format)."""
        out: dict[str, Any] = {"id": self.id}
        if self.messages:
            out["messages"] = [dict(m) for m in self.messages]
        else:
            out["prompt"] = self.prompt
            out["system"] = self.system
        out["servers"] = list(self.servers) if self.servers is not None else None
        out["tools"] = list(self.tools) if self.tools is not None else None
        out["difficulty"] = self.difficulty
        out["answer"] = self.answer
        out["checker"] = checker_to_dict(self.checker)
        if self.max_turns is not None:
            out["max_turns"] = self.max_turns
        out["metadata"] = dict(self.metadata)
        return out


_TASK_FIELDS = (
    "id",
    "prompt",
    "system",
    "messages",
    "servers",
    "tools",
    "difficulty",
    "answer",
    "checker",
    "max_turns",
    "metadata",
)


def _unknown_key_error(key: str, valid: Sequence[str], *, where: str) -> TaskValidationError:
    near = difflib.get_close_matches(key, valid, n=1)
    hint = f"; did you mean {near[0]!r}?" if near else f"; valid keys: {', '.join(valid)}"
    return TaskValidationError(f"unknown key in {where}{hint}", field=key)


def _str_list(value: object, field: str) -> tuple[str, ...] | None:
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise TaskValidationError("must be a list of non-empty strings or null", field=field)
    return tuple(value)


def _number(raw: Mapping[str, Any], key: str, default: float) -> float:
    value = raw.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0 or not math.isfinite(value):
        raise TaskValidationError("must be a finite number >= 0", field=f"checker.{key}")
    return float(value)


def checker_to_dict(checker: Checker) -> dict[str, Any]:
    """A checker as it is written in a task file."""
    if isinstance(checker, PythonChecker):
        return {"type": checker.type, "function": checker.function}
    return attrs.asdict(checker)


def _python_checker(raw: Mapping[str, Any], base_dir: str | Path | None) -> PythonChecker:
    spec = raw.get("function")
    if not isinstance(spec, str) or not spec:
        raise TaskValidationError(
            "must be a non-empty 'file.py:function' or 'package.module:function'", field="checker.function"
        )
    try:
        resolved = load_user_function(spec, base_dir=base_dir)
    except UserCodeImportError as exc:
        raise TaskValidationError(str(exc), field="checker.function") from exc
    return PythonChecker(function=spec, resolved=resolved)


def checker_from_dict(raw: object, *, base_dir: str | Path | None = None) -> Checker:
    """Validate a ``checker`` object (fields are named ``checker.<key>`` in errors).

    Args:
        raw: The object (``{"type": ...}``).
        base_dir: Where a ``python`` checker's relative ``file.py`` is found (the task file's directory;
            None: the current directory).
    """
    if not isinstance(raw, Mapping):
        raise TaskValidationError("must be an object with a 'type'", field="checker")
    kind = raw.get("type")
    if kind not in _CHECKER_FIELDS:
        raise TaskValidationError(
            f"unknown checker type {kind!r}; one of {sorted(_CHECKER_FIELDS)}", field="checker.type"
        )
    for key in raw:
        if key not in _CHECKER_FIELDS[kind]:
            err = _unknown_key_error(str(key), _CHECKER_FIELDS[kind], where=f"{kind} checker")
            raise TaskValidationError(err.reason, field=f"checker.{key}")
    match kind:
        case "exact":
            return ExactChecker()
        case "contains":
            return ContainsChecker()
        case "numeric":
            return NumericChecker(rel_tol=_number(raw, "rel_tol", 1e-6), abs_tol=_number(raw, "abs_tol", 0.0))
        case "python":
            return _python_checker(raw, base_dir)
        case _:
            values: list[str] = []
            for key in ("channel", "contains", "server"):
                value = raw.get(key, "messaging" if key == "server" else None)
                if not isinstance(value, str) or not value:
                    raise TaskValidationError("must be a non-empty string", field=f"checker.{key}")
                values.append(value)
            return MessagePostedChecker(channel=values[0], contains=values[1], server=values[2])


def _messages(value: object) -> tuple[dict[str, Any], ...]:
    if not isinstance(value, list) or not value:
        raise TaskValidationError("must be a non-empty list of chat messages", field="messages")
    for i, message in enumerate(value):
        if not isinstance(message, dict) or message.get("role") not in _ROLES:
            raise TaskValidationError(f"item {i} needs a role in {sorted(_ROLES)}", field="messages")
        if not isinstance(message.get("content"), str):
            raise TaskValidationError(f"item {i} needs a string 'content'", field="messages")
    return tuple(dict(m) for m in value)


def _opt_str(raw: Mapping[str, Any], key: str) -> str | None:
    value = raw.get(key)
    if value is not None and not isinstance(value, str):
        raise TaskValidationError("must be a string or null", field=key)
    return value


def task_from_dict(
    raw: object, *, base_dir: str | Path | None = None, default_checker: Checker | None = None
) -> Task:
    """Validate one task object.

    ``base_dir`` is where a ``python`` checker's relative file is found (the task file's directory; None: the
    current directory); ``default_checker`` is the checker of a task without a ``checker`` key (None: ``exact``).

    Raises:
        TaskValidationError: Naming the field (and, for unknown keys, the nearest valid key).
    """
    if not isinstance(raw, Mapping):
        raise TaskValidationError(f"a task must be a JSON object, got {type(raw).__name__}")
    for key in raw:
        if key not in _TASK_FIELDS:
            raise _unknown_key_error(str(key), _TASK_FIELDS, where="task")
    task_id = raw.get("id")
    if isinstance(task_id, int) and not isinstance(task_id, bool):
        task_id = str(task_id)
    if not isinstance(task_id, str) or not task_id:
        raise TaskValidationError("must be a non-empty string", field="id")
    prompt, system = _opt_str(raw, "prompt"), _opt_str(raw, "system")
    has_messages = raw.get("messages") is not None
    if has_messages == (prompt is not None):
        raise TaskValidationError("give exactly one of 'prompt' and 'messages'", field="prompt")
    if has_messages and system is not None:
        raise TaskValidationError("put the system prompt inside 'messages'", field="system")
    difficulty = raw.get("difficulty", "easy")
    if difficulty not in _DIFFICULTIES:
        raise TaskValidationError(f"must be one of {list(_DIFFICULTIES)}", field="difficulty")
    answer = raw.get("answer")
    if isinstance(answer, int | float) and not isinstance(answer, bool):
        answer = str(answer)
    if answer is not None and not isinstance(answer, str):
        raise TaskValidationError("must be a string, a number or null", field="answer")
    if raw.get("checker") is not None:
        checker = checker_from_dict(raw["checker"], base_dir=base_dir)
    else:
        checker = default_checker if default_checker is not None else ExactChecker()
    if not isinstance(checker, MessagePostedChecker | PythonChecker) and answer is None:
        raise TaskValidationError(f"required by the {checker.type} checker", field="answer")
    if isinstance(checker, NumericChecker):
        try:
            float(answer or "")
        except ValueError:
            raise TaskValidationError("the numeric checker needs a number", field="answer") from None
    max_turns = raw.get("max_turns")
    if max_turns is not None and (
        isinstance(max_turns, bool) or not isinstance(max_turns, int) or max_turns < 1
    ):
        raise TaskValidationError("must be an integer >= 1", field="max_turns")
    metadata = raw.get("metadata")
    metadata = {} if metadata is None else metadata
    if not isinstance(metadata, dict):
        raise TaskValidationError("must be an object", field="metadata")
    return Task(
        id=task_id,
        prompt=prompt,
        system=system,
        messages=_messages(raw["messages"]) if has_messages else (),
        servers=_str_list(raw.get("servers"), "servers"),
        tools=_str_list(raw.get("tools"), "tools"),
        difficulty=difficulty,
        answer=answer,
        checker=checker,
        max_turns=max_turns,
        metadata=dict(metadata),
    )
