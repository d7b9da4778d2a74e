"""The date a chat template sees: one fixed day for a whole run, so re-rendering never changes the prompt.

Several published templates print today's date into the system prompt through ``strftime_now``, the
function transformers' template environment provides: Llama 3.1/3.2/3.3 (``date_string``, when the caller
passes none), Mistral Small 3.2, Granite 3.3, gpt-oss, Apertus. mcprl renders a conversation again at every
turn and compares the re-render with what the model saw, and renders SFT demonstrations on another day than
GRPO episodes, so a live clock turns midnight into template drift. A variable passed to the render shadows the
environment's global of the same name (Jinja's context lookup), so passing a ``strftime_now`` that formats a
fixed day pins every such template, whatever format string it asks for.
"""

from __future__ import annotations

import datetime
import functools
from collections.abc import Callable

__all__ = ["fixed_strftime_now"]


def _strftime_on(day: datetime.date, fmt: str) -> str:
    return datetime.datetime.combine(day, datetime.time()).strftime(fmt)


def fixed_strftime_now(day: datetime.date) -> Callable[[str], str]:
    """A template's ``strftime_now(format)`` that always formats midnight of ``day``.

    Pass it as the ``strftime_now`` keyword argument of ``apply_chat_template``.
    """
    return functools.partial(_strftime_on, day)
