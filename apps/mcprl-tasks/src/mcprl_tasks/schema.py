"""The task JSON shape (see ``docs/INTERFACES.md``) and byte-stable writing of task files."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

__all__ = [
    "Difficulty",
    "contains_checker",
    "make_task",
    "numeric_checker",
    "posted_checker",
    "read_tasks",
    "write_tasks",
]

Difficulty = Literal["easy", "medium", "hard"]


def numeric_checker(*, rel_tol: float = 1e-6, abs_tol: float = 0.005) -> dict[str, Any]:
    """A numeric checker: correct when the answer's number is close to ``float(answer)``."""
    return {"type": "numeric", "rel_tol": rel_tol, "abs_tol": abs_tol}


def contains_checker() -> dict[str, Any]:
    """A contains checker: correct when the task's answer is a substring of the agent's (case-insensitive)."""
    return {"type": "contains"}


def posted_checker(channel: str, contains: str) -> dict[str, Any]:
    """A state checker: a message containing ``contains`` was posted to ``#channel`` in the episode."""
    return {"type": "message_posted", "server": "messaging", "channel": channel, "contains": contains}


def make_task(
    *,
    task_id: str,
    prompt: str,
    servers: list[str],
    difficulty: Difficulty,
    answer: str | None,
    checker: dict[str, Any],
    family: str,
    min_tool_calls: int,
    params: dict[str, Any],
) -> dict[str, Any]:
    """One task in the INTERFACES.md shape.

    ``metadata.params`` holds what the family drew (symbols, multiplier, channel, ...): enough for
    :mod:`mcprl_tasks.demos` to rebuild the ideal tool-call script.
    """
    return {
        "id": task_id,
        "prompt": prompt,
        "system": None,
        "servers": servers,
        "tools": None,
        "difficulty": difficulty,
        "answer": answer,
        "checker": checker,
        "metadata": {"family": family, "min_tool_calls": min_tool_calls, "params": params},
    }


def write_tasks(path: str | Path, tasks: list[dict[str, Any]]) -> Path:
    """Write ``tasks`` as a JSON array with one task per line (same tasks → same bytes).

    Returns:
        The path written.
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    body = ",\n".join(json.dumps(t, ensure_ascii=False, separators=(",", ":")) for t in tasks)
    target.write_text("[\n" + body + "\n]\n" if tasks else "[]\n", encoding="utf-8")
    return target


def read_tasks(path: str | Path) -> list[dict[str, Any]]:
    """Read a task file (JSON array or JSON lines)."""
    text = Path(path).read_text(encoding="utf-8")
    if text.lstrip().startswith("["):
        return json.loads(text)
    return [json.loads(line) for line in text.splitlines() if line.strip()]
