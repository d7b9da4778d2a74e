"""A run SIGKILLed at random points and resumed each time equals the uninterrupted run, on the demo's servers.

The run: the tiny model warm-started on demonstrations of the demo's four task families (so that GRPO's
episodes call the finance, calculator and messaging stdio servers), GRPO steps with a checkpoint after each,
and the warm-start and final evaluations. `kill_resume` (beside this file) draws the kill points over the
uninterrupted run's phases; ``benchmarks/bench_kill_resume.py`` runs many more of them.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
from pathlib import Path

import pytest
from kill_resume import draw_schedule, kill_and_resume, reference_timeline, train_command
from run_compare import run_differences
from train_testkit import (
    CHECKPOINT_EVERY_STEP,
    demo_tasks,
    shared_wandb_service,
    tiny_demo_run,
    wandb_offline_env,
)

pytestmark = pytest.mark.slow


def short_run(root: Path, name: str, tasks: Path, *, steps: int = 3) -> list[str]:
    """30 warm-start steps on clean demonstrations that teach the tool-call format, checkpointed every 10;
    ``steps`` GRPO steps, a checkpoint each."""
    return [
        *tiny_demo_run(root, name, tasks, steps=steps),
        *CHECKPOINT_EVERY_STEP,
        "sft.steps=30",
        "sft.checkpoint_every=10",
        "sft.lr=5e-3",
        "sft.demos=4",
        "sft.teacher_noise=0.0",
    ]


def straight_run(root: Path, tasks: Path, *, steps: int = 3, env: dict[str, str] | None = None) -> Path:
    """The uninterrupted run."""
    command = train_command(short_run(root, "straight", tasks, steps=steps), root / "straight")
    done = subprocess.run(command(False), capture_output=True, text=True, timeout=900, check=False, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    return root / "straight"


@pytest.mark.timeout(2700)  # about 3 min on an idle machine; 15 min and more on a shared one at load 20
@pytest.mark.parametrize("tracking", ["off", "wandb_offline_shared_service"])
def test_a_run_killed_at_random_points_and_resumed_equals_the_uninterrupted_run(
    tmp_path: Path, tracking: str
) -> None:
    """With tracking on, every attempt logs to wandb offline through one shared wandb-core service, which keeps
    the stream of each killed attempt open (test_reproducible.py says why that matters)."""
    with contextlib.ExitStack() as stack:
        env = None if tracking == "off" else wandb_offline_env(stack.enter_context(shared_wandb_service()))
        _killed_at_random_points(tmp_path, env)


def _killed_at_random_points(tmp_path: Path, env: dict[str, str] | None) -> None:
    tasks = demo_tasks(tmp_path / "tasks.json", 1)
    root = tmp_path / "runs"
    straight = straight_run(root, tasks, env=env)
    calls = sum(
        json.loads(line)["metrics"]["tool_calls"] for line in (straight / "trajectories.jsonl").open()
    )
    assert calls > 0, "the warm-started model called no tool: the servers would not be exercised"
    timeline = reference_timeline(straight)
    phases = {s.mark.phase for s in timeline}
    assert phases == {
        "startup",
        "warm_start",
        "evaluation",
        "collection",
        "update",
        "records",
        "checkpoint",
        "summary",
    }, phases
    schedule = draw_schedule(timeline, 3, seed=11)
    killed = root / "killed"
    result = kill_and_resume(
        train_command(short_run(root, "killed", tasks), killed),
        killed,
        schedule=schedule,
        logs=tmp_path / "attempts",
        env=env,
    )
    report = [(k.aimed, k.where, k.detail, k.orphans) for k in result.kills]
    assert len(result.kills) == 3, report
    assert all(k.orphans == 0 for k in result.kills), report
    # Which sampling requests share a forward pass depends on their arrival times, so the sampler's logprobs
    # may differ in their last bits (RESULTS.md, "reproducible sampling"); tokens, rewards, every other
    # metric and the final weights must not.
    assert run_differences(straight, killed, exact=False) == [], report
