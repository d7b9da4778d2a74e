"""A user's own task families: a task-set checker from the config (`tasks.checker`), and a warm start that
leaves families without scripted demonstrations to GRPO, and a run stopped by failing user code that says so."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import mcprl_tasks
from mcprl_env import Episode, EpisodeGroup, ExactChecker, PythonChecker, task_from_dict
from mcprl_train.build import load_demos, load_tasks
from mcprl_train.config import Config
from mcprl_train.errors import ConfigError, InvalidRateError
from mcprl_train.loop.collection import check_invalid_rate


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
    assert sorted(d.task_id for d in demos) == sorted(str(t["id"]) for t in bundled)
    assert all(d.succeeds for d in demos)  # the ideal teacher's scripts


def test_a_set_with_no_demonstrations_says_to_disable_the_warm_start(tmp_path: Path) -> None:
    path = write(tmp_path / "own.jsonl", [own_task(i) for i in range(3)])
    config = Config.load("cpu", overrides=[f"tasks.train={path}"])
    with pytest.raises(ConfigError, match=r"families: my_family.*set sft\.enabled=false"):
        load_demos(config)


def test_tasks_checker_is_the_default_of_tasks_that_name_none(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "house_rules.py").write_text("def grade(episode):\n    return True\n", encoding="utf-8")
    unnamed: dict[str, object] = {
        "id": "u",
        "prompt": "p",
        "metadata": {"family": "my_family"},
    }  # no answer: the checker decides
    own = own_task(1)
    path = write(tmp_path / "tasks.jsonl", [unnamed, own])
    monkeypatch.chdir(tmp_path)  # config paths are relative to the current directory
    overrides = [f"tasks.train={path}", f"tasks.validation={path}", "grpo.tasks_per_step=2"]
    train, validation = load_tasks(
        Config.load("cpu", overrides=[*overrides, "tasks.checker=house_rules.py:grade"])
    )
    for tasks in (list(train), validation):
        assert isinstance(tasks[0].checker, PythonChecker)
        assert tasks[0].checker.resolved.origin == str(tmp_path / "house_rules.py")
        assert tasks[1].checker.type == "contains"  # a task's own checker wins
    with pytest.raises(ConfigError, match=r"tasks\.checker: .*no function 'grdae' \(its functions: grade\)"):
        load_tasks(Config.load("cpu", overrides=[*overrides, "tasks.checker=house_rules.py:grdae"]))
    without = write(tmp_path / "plain.jsonl", [{**unnamed, "answer": "x"}, own])
    train, _ = load_tasks(
        Config.load(
            "cpu", overrides=[f"tasks.train={without}", "tasks.validation=null", "grpo.tasks_per_step=2"]
        )
    )
    assert isinstance(train.task_at(0).checker, ExactChecker)


def _episode(i: int, *, stop_reason: str, error: str | None) -> Episode:
    valid = error is None
    return Episode(
        episode_id=f"t/{i}",
        task_id="t",
        group_id="t",
        token_ids=[1],
        prompt_length=1,
        loss_mask=[0],
        sampler_logprobs=[0.0],
        messages=[],
        reward=0.0,
        reward_components={},
        valid=valid,
        success=False,
        stop_reason=stop_reason,
        error=error,
        answer=None,
        metrics={},
    )


def test_an_invalid_rate_from_user_code_points_at_the_user_code() -> None:
    task = task_from_dict({"id": "t", "prompt": "p", "answer": "1"})
    failed = [
        _episode(i, stop_reason="user_code_error", error="user code: checks.py:grade raised")
        for i in range(3)
    ]
    group = EpisodeGroup(
        group_id="t", task=task, episodes=[*failed, _episode(3, stop_reason="answer", error=None)]
    )
    with pytest.raises(InvalidRateError, match=r"3 of them failed in a user checker or reward function"):
        check_invalid_rate([group], 0.5)
    infra = [_episode(i, stop_reason="infra_error", error="search: timeout") for i in range(3)]
    group = EpisodeGroup(
        group_id="t", task=task, episodes=[*infra, _episode(3, stop_reason="answer", error=None)]
    )
    with pytest.raises(InvalidRateError, match=r"'search: timeout', 3\)\]\. Check the tool servers"):
        check_invalid_rate([group], 0.5)
