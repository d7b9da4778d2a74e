"""Errors raised by mcprl-env.

Model faults (a malformed tool call) are data: they are turned into observations and counted, never raised out
of an episode. What is raised here are programming and configuration errors (bad task files, bad configs,
a chat template that rewrites earlier tokens) and the typed parse errors the parsers hand to the episode loop.
"""

from __future__ import annotations

from typing import Literal

__all__ = [
    "CheckerInfraError",
    "ConfigError",
    "EnvError",
    "JudgeError",
    "ParseErrorKind",
    "TaskValidationError",
    "TemplateDriftError",
    "ToolCallParseError",
    "UnknownToolCallFormatError",
    "UserCodeError",
    "UserCodeImportError",
]

ParseErrorKind = Literal[
    "unclosed_tag",
    "unopened_tag",
    "nested_tag",
    "invalid_json",
    "invalid_xml",
    "not_an_object",
    "missing_name",
    "invalid_name",
    "invalid_arguments",
    "unexpected_keys",
    "empty_call",
    "too_large",
]
"""Why a tool call could not be parsed (a model fault; counted per kind in episode metrics)."""


class EnvError(Exception):
    """Base class of every error raised by mcprl-env."""


class ConfigError(EnvError, ValueError):
    """An invalid environment or reward configuration."""


class UnknownToolCallFormatError(ConfigError):
    """The chat template renders tool calls in no registered format (or none at all): set ``env.parser``."""


class UserCodeImportError(ConfigError):
    """A user checker or reward function (``module:function``) that cannot be imported or found."""


class UserCodeError(EnvError, RuntimeError):
    """A user checker or reward function raised while judging an episode (the episode is invalid, not wrong).

    Attributes:
        spec: The function's spec (``checks.py:grade``).
        task_id: The task whose episode it was judging.
        traceback_text: The formatted traceback of the user's exception.
    """

    def __init__(self, message: str, *, spec: str, task_id: str, traceback_text: str) -> None:
        self.spec = spec
        self.task_id = task_id
        self.traceback_text = traceback_text
        super().__init__(f"task {task_id!r}: {message}")


class CheckerInfraError(EnvError, RuntimeError):
    """A checker could not reach a verdict for infrastructure reasons (an endpoint down, a timeout).

    Raised from a ``python`` checker, it makes the episode invalid with stop reason ``infra_error``: masked out
    of the baseline and the loss like a tool server's crash, never scored as the model's failure nor reported
    as a bug in the user's code.
    """


class JudgeError(CheckerInfraError):
    """An LLM judge gave no verdict: HTTP errors, timeouts or unparseable verdicts after its retries."""


class TaskValidationError(EnvError, ValueError):
    """A task (or task file) that does not match the task schema.

    Attributes:
        source: File name (or ``"<dict>"``) the task came from.
        line: 1-based line where the offending item starts, when known.
        index: 0-based position of the item in the file, when known.
        field: Name of the offending field, when the problem is one field.
        reason: What is wrong, in a few words.
    """

    def __init__(
        self,
        reason: str,
        *,
        source: str = "<dict>",
        line: int | None = None,
        index: int | None = None,
        field: str | None = None,
    ) -> None:
        self.reason = reason
        self.source = source
        self.line = line
        self.index = index
        self.field = field
        where = source
        if line is not None:
            where += f":{line}"
        if index is not None:
            where += f" (item {index})"
        what = f"field {field!r}: " if field else ""
        super().__init__(f"{where}: {what}{reason}")

    def located(self, *, source: str, line: int | None, index: int | None) -> TaskValidationError:
        """The same error with its location filled in (used by the loaders)."""
        return TaskValidationError(self.reason, source=source, line=line, index=index, field=self.field)


class ToolCallParseError(EnvError, ValueError):
    """A tool call the model wrote that cannot be turned into a call without guessing.

    Attributes:
        kind: Machine-readable reason (one of `ParseErrorKind`), used for metrics.
        reason: Human-readable reason, shown to the model as the tool observation.
        raw: The offending text (truncated), for trajectories and debugging.
    """

    def __init__(self, kind: ParseErrorKind, reason: str, *, raw: str = "") -> None:
        self.kind: ParseErrorKind = kind
        self.reason = reason
        self.raw = raw[:500]
        super().__init__(f"{kind}: {reason}")


class TemplateDriftError(EnvError, RuntimeError):
    """Re-rendering the conversation changed text the episode already holds as tokens.

    Token-in/token-out training needs every earlier token to stay as sampled. The transcript keeps the turn just
    sampled as generated however the template re-renders it (Qwen3 drops its think block), and the environment's
    messages since the previous turn as the model saw them when only their whitespace changes (Hermes 3's last
    tool response); any other rewrite of earlier text (the system prompt, a user's message, older turns, a
    header that counts messages) is this error. ``EnvConfig(on_template_drift="report")`` keeps the sampled
    tokens, appends what the template renders after the turn just sampled and counts the drift instead.

    Attributes:
        position: Character offset of the first difference.
        expected: Text the episode holds around that offset.
        rendered: Text the template rendered around that offset.
    """

    def __init__(self, position: int, expected: str, rendered: str, *, before: str = "") -> None:
        self.position = position
        self.expected = expected
        self.rendered = rendered
        super().__init__(
            f"chat template re-rendered earlier tokens differently at char {position} (after {before!r}): "
            f"held {expected!r}, rendered {rendered!r}"
        )
