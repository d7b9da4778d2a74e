"""A run SIGKILLed at random points and resumed each time equals the uninterrupted run, on the demo's servers.

The run: the tiny model warm-started on demonstrations of the demo's four task families (so that GRPO's
episodes call the finance, calculator and messaging stdio servers), GRPO steps with a checkpoint after each,
and the warm-start and final evaluations. `mcprl_train.run.kill_resume` draws the kill points;
``benchmarks/bench_kill_resume.py`` runs many more of them.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest
from train_testkit import demo_tasks

from mcprl_train.run.compare import run_differences
from mcprl_train.run.kill_resume import kill_and_resume, train_command

pytestmark = pytest.mark.slow


def short_run(root: Path, name: str, tasks: Path, *, steps: int = 3) -> list[str]:
    """A few warm-start steps that teach the tool-call format, ``steps`` GRPO steps, a checkpoint each."""
    return [
        f"run.name={name}",
        f"run.output_dir={root}",
        f"run.steps={steps}",
        "run.checkpoint_every=1",
        "run.seed=5",
        f"tasks.train={tasks}",
        f"tasks.validation={tasks}",
        "sft.enabled=true",
        "sft.steps=30",
        "sft.checkpoint_every=10",
        "sft.lr=5e-3",
        "sft.demos=4",
        "sft.batch_size=4",
        "sft.teacher_noise=0.0",
        "grpo.group_size=2",
        "grpo.tasks_per_step=4",
        "grpo.ppo_epochs=1",
        "grpo.minibatches=2",
        "grpo.filter_zero_std=false",
        "env.max_new_tokens_per_turn=48",
        "env.max_turns_by_difficulty={easy: 3, medium: 3, hard: 3}",
        "env.template_date=2026-01-01",
        "collection.max_concurrent_episodes=16",
        "eval.every=0",
        "optim.lr=1e-3",
        "optim.warmup_steps=0",
        "tracking.progress=false",
    ]


def straight_run(root: Path, tasks: Path, *, steps: int = 3) -> tuple[Path, float]:
    """The uninterrupted run and its wall time."""
    command = train_command(short_run(root, "straight", tasks, steps=steps), root / "straight")
    t0 = time.monotonic()
    done = subprocess.run(command(False), capture_output=True, text=True, timeout=900, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return root / "straight", time.monotonic() - t0


@pytest.mark.timeout(2700)  # about 3 min on an idle machine; 15 min and more on a shared one at load 20
def test_a_run_killed_at_random_points_and_resumed_equals_the_uninterrupted_run(tmp_path: Path) -> None:
    tasks = demo_tasks(tmp_path / "tasks.json", 1)
    root = tmp_path / "runs"
    straight, run_s = straight_run(root, tasks)
    calls = sum(
        json.loads(line)["metrics"]["tool_calls"] for line in (straight / "trajectories.jsonl").open()
    )
    assert calls > 0, "the warm-started model called no tool: the servers would not be exercised"
    killed = root / "killed"
    result = kill_and_resume(
        train_command(short_run(root, "killed", tasks), killed),
        killed,
        kills=3,
        seed=11,
        run_s=run_s,
        logs=tmp_path / "attempts",
    )
    report = [(k.trigger, k.phase, k.orphans) for k in result.kills]
    assert len(result.kills) == 3, report
    assert all(k.orphans == 0 for k in result.kills), report
    # Which sampling requests share a forward pass depends on their arrival times, so the sampler's logprobs
    # may differ in their last bits (RESULTS.md, "reproducible sampling"); tokens, rewards, every other
    # metric and the final weights must not.
    assert run_differences(straight, killed, exact=False) == [], report
