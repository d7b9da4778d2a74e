from __future__ import annotations

import pytest

from mcprl_tasks import load_preset, read_tasks
from mcprl_tasks.schema import make_task, numeric_checker, posted_checker


def test_make_task_has_the_interface_fields() -> None:
    task = make_task(
        task_id="quote-mul-train-00001",
        prompt="Price of HLDR times 3?",
        servers=["finance", "calculator"],
        difficulty="easy",
        answer="148.59",
        checker=numeric_checker(),
        family="quote_mul",
        min_tool_calls=2,
        params={"symbols": ["HLDR"], "k": 3},
    )
    assert task["checker"] == {"type": "numeric", "rel_tol": 1e-6, "abs_tol": 0.005}
    assert task["metadata"] == {
        "family": "quote_mul",
        "min_tool_calls": 2,
        "params": {"symbols": ["HLDR"], "k": 3},
    }
    assert posted_checker("markets", "49.53") == {
        "type": "message_posted",
        "server": "messaging",
        "channel": "markets",
        "contains": "49.53",
    }


def test_shipped_tasks_load_with_the_environment_loader() -> None:
    env_tasks = pytest.importorskip("mcprl_env.tasks")
    for name in ("demo", "default"):
        for path in load_preset(name):
            for raw in read_tasks(path)[:200]:
                task = env_tasks.task_from_dict(raw)
                assert task.id == raw["id"]
