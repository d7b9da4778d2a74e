"""Task validation: every problem names its field."""

from __future__ import annotations

from typing import Any

import pytest

from mcprl_env import (
    ContainsChecker,
    MessagePostedChecker,
    NumericChecker,
    TaskValidationError,
    task_from_dict,
)

BASE: dict[str, Any] = {
    "id": "quote-mul-00017",
    "prompt": "What is 3 times the price of ACME?",
    "system": None,
    "servers": ["finance", "calculator"],
    "tools": None,
    "difficulty": "easy",
    "answer": "370.35",
    "checker": {"type": "numeric", "rel_tol": 1e-6, "abs_tol": 0.005},
    "metadata": {"family": "quote_mul", "min_tool_calls": 2},
}


def test_the_documented_example_task_loads() -> None:
    task = task_from_dict(BASE)
    assert task.checker == NumericChecker(rel_tol=1e-6, abs_tol=0.005)
    assert task.servers == ("finance", "calculator")
    assert task.metadata["min_tool_calls"] == 2
    assert task.initial_messages() == [{"role": "user", "content": BASE["prompt"]}]
    assert task_from_dict(task.to_dict()) == task


def test_system_prompt_and_messages_forms() -> None:
    task = task_from_dict({**BASE, "system": "Be brief."})
    assert task.initial_messages()[0] == {"role": "system", "content": "Be brief."}
    raw = {k: v for k, v in BASE.items() if k not in ("prompt", "system")}
    msgs = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]
    assert task_from_dict({**raw, "messages": msgs}).initial_messages() == msgs


def test_checkers_and_defaults() -> None:
    assert isinstance(task_from_dict({**BASE, "checker": {"type": "contains"}}).checker, ContainsChecker)
    posted = task_from_dict(
        {
            **BASE,
            "answer": None,
            "checker": {"type": "message_posted", "channel": "general", "contains": "370.35"},
        }
    )
    assert posted.checker == MessagePostedChecker(channel="general", contains="370.35", server="messaging")
    assert task_from_dict({"id": 7, "prompt": "p", "answer": 3}).answer == "3"


@pytest.mark.parametrize(
    ("change", "field", "text"),
    [
        ({"id": ""}, "id", "non-empty"),
        ({"prompt": None}, "prompt", "exactly one"),
        ({"messages": [{"role": "user", "content": "x"}]}, "prompt", "exactly one"),
        ({"difficulty": "insane"}, "difficulty", "easy"),
        ({"servers": "finance"}, "servers", "list"),
        ({"tools": [1]}, "tools", "list"),
        ({"answer": None}, "answer", "numeric checker"),
        ({"answer": "three"}, "answer", "number"),
        ({"checker": {"type": "regex"}}, "checker.type", "unknown checker"),
        ({"checker": {"type": "numeric", "rel_tol": -1}}, "checker.rel_tol", ">= 0"),
        ({"checker": {"type": "numeric", "abs_tl": 1}}, "checker.abs_tl", "abs_tol"),
        ({"checker": {"type": "message_posted", "channel": "g"}}, "checker.contains", "non-empty"),
        ({"max_turns": 0}, "max_turns", ">= 1"),
        ({"metadata": []}, "metadata", "object"),
        ({"answr": "1"}, "answr", "did you mean 'answer'"),
    ],
)
def test_invalid_tasks_name_the_field(change: dict[str, Any], field: str, text: str) -> None:
    with pytest.raises(TaskValidationError) as info:
        task_from_dict({**BASE, **change})
    assert info.value.field == field
    assert text in str(info.value)


def test_a_task_must_be_an_object() -> None:
    with pytest.raises(TaskValidationError, match="JSON object"):
        task_from_dict(["not", "a", "task"])
