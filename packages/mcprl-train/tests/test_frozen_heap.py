"""The run's long-lived objects are frozen out of the cyclic collector during the stages, and handed back."""

from __future__ import annotations

import gc
from pathlib import Path

import pytest
from train_testkit import demo_tasks

from mcprl_train.config import Config
from mcprl_train.loop.trainer import Trainer
from mcprl_train.run.run_dir import RunDir

pytestmark = pytest.mark.slow


class Stop(Exception):
    """Raised by the hook to end a run in the middle of a step."""


def config(tmp_path: Path, name: str) -> Config:
    path = demo_tasks(tmp_path / "tasks.json", 2, families=["quote"])
    return Config.load(
        "cpu",
        overrides=[
            f"run.name={name}",
            f"run.output_dir={tmp_path / 'runs'}",
            "run.steps=1",
            f"tasks.train={path}",
            f"tasks.validation={path}",
            "tools.offline=[finance]",
            "tools.allow_tools={finance: [get_quote]}",
            "sft.enabled=false",
            "grpo.group_size=2",
            "grpo.tasks_per_step=2",
            "grpo.filter_zero_std=false",
            "env.max_new_tokens_per_turn=8",
            "env.max_turns_by_difficulty={easy: 1, medium: 1, hard: 1}",
            "eval.n_tasks=1",
            "tracking.progress=false",
        ],
    )


def test_the_heap_is_frozen_during_the_stages_and_unfrozen_after(tmp_path: Path) -> None:
    assert gc.get_freeze_count() == 0
    seen: list[int] = []
    cfg = config(tmp_path, "run")
    Trainer(cfg, RunDir.create(cfg), hooks=(lambda _event, _t: seen.append(gc.get_freeze_count()),)).run()
    assert seen
    assert min(seen) > 0, "nothing was frozen while the run stepped"
    assert gc.get_freeze_count() == 0


def test_a_failing_run_unfreezes_the_heap_too(tmp_path: Path) -> None:
    def stop(event: str, _trainer: Trainer) -> None:
        if event == "after_rollout":
            raise Stop

    cfg = config(tmp_path, "failing")
    with pytest.raises(Stop):
        Trainer(cfg, RunDir.create(cfg), hooks=(stop,)).run()
    assert gc.get_freeze_count() == 0
