"""Outcome checkers: is the episode's final answer (or the servers' state) correct?

``exact``, ``numeric`` and ``contains`` look at the answer; ``message_posted`` reads the messaging server's
state for the episode (``read_messages`` called with the episode's id, so episodes never see each other);
``python`` calls a user's function with the whole `FinishedEpisode` (see `mcprl_env.finished`).
"""

from __future__ import annotations

import json
import math
import re
from typing import assert_never

import attrs

from mcprl_env.errors import CheckerInfraError, UserCodeError
from mcprl_env.finished import FinishedEpisode
from mcprl_env.protocols import ToolCaller
from mcprl_env.tasks import (
    ContainsChecker,
    ExactChecker,
    MessagePostedChecker,
    NumericChecker,
    PythonChecker,
    Task,
)
from mcprl_env.user_code import call_user_function

__all__ = ["CheckResult", "check_outcome", "extract_number", "mentions", "normalize_text"]

_NUMBER = re.compile(r"[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)?(?:\.\d+)?(?:[eE][-+]?\d+)?")


@attrs.frozen(kw_only=True)
class CheckResult:
    """Outcome of a check.

    Attributes:
        correct: The task was solved.
        infra_error: Set when the check itself could not run (the episode is then invalid, not wrong).
        user_error: Set when a ``python`` checker raised or returned something other than a bool (the episode
            is then invalid, not wrong).
    """

    correct: bool
    infra_error: str | None = None
    user_error: UserCodeError | None = None


def normalize_text(text: str) -> str:
    """Case-folded text with runs of whitespace collapsed to one space."""
    return " ".join(text.split()).casefold()


def extract_number(text: str) -> float | None:
    """The number an answer states: the whole text when it is a number (``$1,234.50`` too), else the last
    number in it; None when there is none."""
    cleaned = text.strip().strip("$€£%").replace(",", "").strip()
    try:
        value = float(cleaned)
    except ValueError:
        candidates = [m.group(0) for m in _NUMBER.finditer(text) if any(c.isdigit() for c in m.group(0))]
        if not candidates:
            return None
        try:
            value = float(candidates[-1].replace(",", ""))
        except ValueError:
            return None
    return value if math.isfinite(value) else None


def mentions(text: str, needle: str) -> bool:
    """Whether ``text`` contains ``needle`` as a whole word or number (case-insensitive).

    A bare substring test would accept ``3.2`` inside ``3.25`` or ``13.2``, and a policy could be paid for posting
    a string of digits; here the needle may not continue a word, a number or a decimal part on either side.
    """
    if not needle:
        return True
    pattern = rf"(?<![\w.]){re.escape(needle)}(?!\w|\.\d)"
    return re.search(pattern, text, flags=re.IGNORECASE) is not None


def _texts(value: object) -> list[str]:
    """Every string under a ``text``/``content``/``message`` key, recursively."""
    match value:
        case dict():
            out: list[str] = []
            for key, item in value.items():
                if key in ("text", "content", "message") and isinstance(item, str):
                    out.append(item)
                else:
                    out.extend(_texts(item))
            return out
        case list():
            return [t for item in value for t in _texts(item)]
        case _:
            return []


async def _check_message_posted(
    checker: MessagePostedChecker, manager: ToolCaller, episode_id: str
) -> CheckResult:
    result = await manager.call(
        f"{checker.server}.read_messages", {"channel": checker.channel, "limit": 100}, episode_id=episode_id
    )
    if result.kind == "infra_error":
        return CheckResult(correct=False, infra_error=f"{result.error_type}: {result.text}")
    if result.kind != "ok":
        return CheckResult(correct=False)
    try:
        messages = _texts(json.loads(result.text))
    except json.JSONDecodeError:
        messages = [result.text]
    return CheckResult(correct=any(mentions(m, checker.contains) for m in messages))


async def _check_python(checker: PythonChecker, episode: FinishedEpisode | None) -> CheckResult:
    if episode is None:
        raise ValueError(f"the python checker {checker.function!r} needs the finished episode (episode=...)")
    try:
        verdict = await call_user_function(checker.resolved, episode)
    except UserCodeError as exc:
        return CheckResult(correct=False, user_error=exc)
    except CheckerInfraError as exc:
        return CheckResult(correct=False, infra_error=f"{checker.function}: {exc}")
    if not isinstance(verdict, bool):
        error = UserCodeError(
            f"{checker.function} returned {verdict!r} ({type(verdict).__name__}); a checker returns True or False",
            spec=checker.function,
            task_id=episode.task.id,
            traceback_text="",
        )
        return CheckResult(correct=False, user_error=error)
    return CheckResult(correct=verdict)


async def check_outcome(
    task: Task,
    answer: str | None,
    *,
    manager: ToolCaller,
    episode_id: str,
    episode: FinishedEpisode | None = None,
) -> CheckResult:
    """Check an episode's outcome with its task's checker.

    Args:
        task: The task (its ``checker`` and ``answer``).
        answer: The episode's final answer, or None when it gave none.
        manager: Tool caller for state checks.
        episode_id: The episode whose server state is checked.
        episode: The whole episode, which a ``python`` checker is called with.
    """
    checker = task.checker
    if isinstance(checker, MessagePostedChecker):
        return await _check_message_posted(checker, manager, episode_id)
    if isinstance(checker, PythonChecker):
        return await _check_python(checker, episode)
    if answer is None or task.answer is None:
        return CheckResult(correct=False)
    match checker:
        case ExactChecker():
            return CheckResult(correct=normalize_text(answer) == normalize_text(task.answer))
        case ContainsChecker():
            return CheckResult(correct=task.answer.casefold() in answer.casefold())
        case NumericChecker():
            got, want = extract_number(answer), float(task.answer)
            ok = got is not None and math.isclose(got, want, rel_tol=checker.rel_tol, abs_tol=checker.abs_tol)
            return CheckResult(correct=ok)
        case _:
            assert_never(checker)
