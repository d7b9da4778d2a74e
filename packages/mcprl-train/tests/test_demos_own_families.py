"""The warm start on a training set with a user's own task families: those train with GRPO alone."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import mcprl_tasks
from mcprl_train.build import load_demos
from mcprl_train.config import Config
from mcprl_train.errors import ConfigError


def own_task(i: int) -> dict[str, object]:
    return {
        "id": f"own-{i}",
        "prompt": "What is the answer?",
        "checker": {"type": "contains"},
        "answer": "42",
        "metadata": {"family": "my_family"},
    }


def write(path: Path, tasks: list[dict[str, object]]) -> Path:
    path.write_text("".join(json.dumps(t) + "\n" for t in tasks), encoding="utf-8")
    return path


def test_tasks_without_demonstrations_are_left_to_grpo(tmp_path: Path) -> None:
    bundled = mcprl_tasks.read_tasks(mcprl_tasks.load_preset("demo")[0])[:12]
    path = write(tmp_path / "mixed.jsonl", [*bundled, *(own_task(i) for i in range(12))])
    config = Config.load("cpu", overrides=[f"tasks.train={path}", "sft.demos=100", "sft.teacher_noise=0.0"])
    demos = load_demos(config)
    assert sorted(task_id for task_id, _, _ in demos) == sorted(str(t["id"]) for t in bundled)
    assert all(succeeds for _, _, succeeds in demos)  # the ideal teacher's scripts


def test_a_set_with_no_demonstrations_says_to_disable_the_warm_start(tmp_path: Path) -> None:
    path = write(tmp_path / "own.jsonl", [own_task(i) for i in range(3)])
    config = Config.load("cpu", overrides=[f"tasks.train={path}"])
    with pytest.raises(ConfigError, match=r"families: my_family.*set sft\.enabled=false"):
        load_demos(config)
