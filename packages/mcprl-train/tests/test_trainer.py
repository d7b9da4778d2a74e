"""The whole loop on the tiny model and a real offline MCP server: run, interrupt, resume exactly."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

import mcprl_tasks
from mcprl_policy import HFSampler, ReferencePolicy
from mcprl_train.config import Config
from mcprl_train.loop.trainer import Trainer
from mcprl_train.run.run_dir import RunDir

pytestmark = pytest.mark.slow


class Interrupted(Exception):
    """Raised by a hook to cut a run after a checkpoint (a crash at that point)."""


def task_file(tmp_path: Path, n: int = 3) -> Path:
    train, _ = mcprl_tasks.load_preset("demo")
    tasks = [t for t in mcprl_tasks.read_tasks(train) if t["metadata"]["family"] == "quote"][:n]
    path = tmp_path / "tasks.json"
    path.write_text(json.dumps(tasks))
    return path


def make_config(tmp_path: Path, name: str, tasks: Path, *extra: str) -> Config:
    return Config.load(
        "cpu",
        overrides=[
            f"run.name={name}",
            f"run.output_dir={tmp_path / 'runs'}",
            "run.steps=3",
            "run.checkpoint_every=1",
            "run.seed=3",
            f"tasks.train={tasks}",
            f"tasks.validation={tasks}",
            "tools.offline=[finance]",
            "tools.allow_tools={finance: [get_quote]}",
            "sft.enabled=true",
            "sft.steps=2",
            "sft.demos=3",
            "sft.batch_size=2",
            "sft.teacher_noise=0.5",
            "grpo.group_size=2",
            "grpo.tasks_per_step=2",
            "grpo.ppo_epochs=1",
            "grpo.minibatches=2",
            "grpo.kl_coef=0.0",
            "grpo.filter_zero_std=false",
            "env.max_new_tokens_per_turn=12",
            "env.max_turns_by_difficulty={easy: 2, medium: 2, hard: 2}",
            "collection.max_concurrent_episodes=1",
            "eval.every=2",
            "eval.n_tasks=2",
            "optim.lr=1e-3",
            "optim.warmup_steps=0",
            "tracking.progress=false",
            "collection.overlap=false",  # collected, then learned (test_overlap.py runs the overlap)
            *extra,
        ],
    )


def params_of(policy: Any) -> list[torch.Tensor]:
    return [p.detach().clone() for p in policy.trainable_parameters()]


class Recorder:
    """Hook recording task ids, parameters and metrics per step; optionally interrupts after a checkpoint."""

    def __init__(self, *, stop_after_checkpoint: int | None = None) -> None:
        self.tasks: dict[int, list[str]] = {}
        self.params: dict[int, list[torch.Tensor]] = {}
        self.sampler_params_before: dict[int, list[torch.Tensor]] = {}
        self.stop_after_checkpoint = stop_after_checkpoint

    def __call__(self, event: str, trainer: Trainer) -> None:
        step = trainer.state.step
        match event:
            case "before_rollout":
                assert isinstance(trainer.sampler, HFSampler)
                self.sampler_params_before[step + 1] = params_of(trainer.sampler.policy)
            case "after_step":
                self.tasks[step] = list(trainer.last_step_tasks)
                self.params[step] = params_of(trainer.policy)
            case "after_checkpoint" if step == self.stop_after_checkpoint and trainer.state.stage == "grpo":
                raise Interrupted
            case _:
                pass


def test_resume_continues_exactly_where_an_uninterrupted_run_would(tmp_path: Path) -> None:
    tasks = task_file(tmp_path)
    reference = Recorder()
    cfg = make_config(tmp_path, "straight", tasks)
    summary = Trainer(cfg, RunDir.create(cfg), hooks=(reference,)).run()
    assert summary["steps"] == 3

    first = Recorder(stop_after_checkpoint=2)
    cfg_b = make_config(tmp_path, "cut", tasks)
    run_b = RunDir.create(cfg_b)
    with pytest.raises(Interrupted):
        Trainer(cfg_b, run_b, hooks=(first,)).run()
    assert sorted(first.tasks) == [1, 2]

    resumed = Recorder()
    trainer = Trainer(cfg_b, RunDir.open(run_b.path), resume=True, hooks=(resumed,))
    trainer.run()

    # The sampler generated from the restored weights, which are the uninterrupted run's after step 2.
    for a, b in zip(resumed.sampler_params_before[3], reference.params[2], strict=True):
        assert torch.equal(a, b)
    # No task replayed or skipped; step 2 crosses the epoch boundary (3 tasks, 2 per step).
    assert (
        first.tasks[1] + first.tasks[2] + resumed.tasks[3]
        == reference.tasks[1] + reference.tasks[2] + reference.tasks[3]
    )
    assert len(set(reference.tasks[1] + reference.tasks[2])) == 3
    # The next step equals the uninterrupted run's next step, bit for bit.
    for a, b in zip(resumed.params[3], reference.params[3], strict=True):
        assert torch.equal(a, b)
    grpo_a = [
        r for r in RunDir.open(tmp_path / "runs" / "straight").read_metrics().records if r["kind"] == "grpo"
    ]
    grpo_b = [r for r in run_b.read_metrics().records if r["kind"] == "grpo"]
    assert [r["step"] for r in grpo_b] == [1, 2, 3]
    assert grpo_a[-1]["rollout/reward_mean"] == grpo_b[-1]["rollout/reward_mean"]
    assert grpo_a[-1]["loss/policy"] == grpo_b[-1]["loss/policy"]
    # Trajectories: every episode once.
    records = run_b.read_trajectories().records
    keys = [(r["step"], r["episode_id"]) for r in records]
    assert len(keys) == len(set(keys)) == 3 * 2 * 2


def reference_of(trainer: Trainer) -> list[torch.Tensor]:
    assert trainer.learner is not None
    reference = trainer.learner.reference
    assert isinstance(reference, ReferencePolicy)  # one process: a full copy
    assert reference.frozen is not None
    return [t.detach().clone() for t in reference.frozen.state_dict().values()]


class ReferenceRecorder(Recorder):
    """Also records the EMA reference's weights after each step and before each rollout."""

    def __init__(self, *, stop_after_checkpoint: int | None = None) -> None:
        super().__init__(stop_after_checkpoint=stop_after_checkpoint)
        self.reference: dict[int, list[torch.Tensor]] = {}
        self.reference_before: dict[int, list[torch.Tensor]] = {}
        self.policy_before: dict[int, list[torch.Tensor]] = {}

    def __call__(self, event: str, trainer: Trainer) -> None:
        if event == "before_rollout":
            self.reference_before[trainer.state.step + 1] = reference_of(trainer)
            model = trainer.policy.model.state_dict().values()
            self.policy_before[trainer.state.step + 1] = [t.detach().clone() for t in model]
        elif event == "after_step":
            self.reference[trainer.state.step] = reference_of(trainer)
        super().__call__(event, trainer)


def test_resume_continues_with_the_same_ema_reference(tmp_path: Path) -> None:
    tasks = task_file(tmp_path)
    # The entropy bonus moves the policy at every step even when every group's rewards tie (no advantage).
    ema = (
        "grpo.kl_coef=0.05",
        "grpo.entropy_coef=0.01",
        "reference.every=1",
        "reference.ema=0.5",
        "eval.every=0",
    )
    straight = ReferenceRecorder()
    cfg = make_config(tmp_path, "straight", tasks, *ema)
    Trainer(cfg, RunDir.create(cfg), hooks=(straight,)).run()
    # GRPO starts with the warm-started policy as its reference, which then moves at every step.
    for a, b in zip(straight.reference_before[1], straight.policy_before[1], strict=True):
        assert torch.equal(a, b)
    assert not all(
        torch.equal(a, b) for a, b in zip(straight.reference[1], straight.reference[2], strict=True)
    )

    first = ReferenceRecorder(stop_after_checkpoint=2)
    cfg_b = make_config(tmp_path, "cut", tasks, *ema)
    run_b = RunDir.create(cfg_b)
    with pytest.raises(Interrupted):
        Trainer(cfg_b, run_b, hooks=(first,)).run()
    resumed = ReferenceRecorder()
    Trainer(cfg_b, RunDir.open(run_b.path), resume=True, hooks=(resumed,)).run()

    # The resumed run starts from the reference the interrupted one had, not a copy of the restored policy.
    for a, b in zip(resumed.reference_before[3], straight.reference[2], strict=True):
        assert torch.equal(a, b)
    for a, b in zip(resumed.reference[3], straight.reference[3], strict=True):
        assert torch.equal(a, b)
    for a, b in zip(resumed.params[3], straight.params[3], strict=True):
        assert torch.equal(a, b)


def test_run_directory_holds_config_metrics_trajectories_checkpoints_and_summary(tmp_path: Path) -> None:
    tasks = task_file(tmp_path)
    cfg = make_config(tmp_path, "files", tasks, "run.steps=1", "eval.every=0")
    run_dir = RunDir.create(cfg)
    summary = Trainer(cfg, run_dir).run()
    for name in ("config.yaml", "metrics.jsonl", "trajectories.jsonl", "summary.json"):
        assert (run_dir.path / name).is_file(), name
    assert run_dir.checkpoints.load_latest() is not None
    records = run_dir.read_metrics().records
    kinds = {r["kind"] for r in records}
    assert kinds == {"sft", "grpo", "eval"}
    (grpo,) = [r for r in records if r["kind"] == "grpo"]
    # The tool servers' events of the step (the tiny model may make no call at all in one step).
    assert grpo["tools/step/restarts"] == grpo["tools/step/infra_errors"] == grpo["tools/step/timeouts"] == 0
    assert grpo["tools/step/finance/restarts"] == grpo["tools/step/finance/crashes"] == 0
    assert summary["success_warm_start"] is not None
    assert summary["success_final"] is not None


class _Tasks:
    """An in-memory task source with fixed epoch orders (one that, unlike a task file, may repeat ids)."""

    def __init__(self, ids: str, orders: list[list[int]]) -> None:
        from mcprl_env import task_from_dict

        self.tasks = [task_from_dict({"id": i, "prompt": "p", "answer": "1"}) for i in ids]
        self.orders = orders

    def __len__(self) -> int:
        return len(self.tasks)

    def task_at(self, index: int) -> Any:
        return self.tasks[index]

    def epoch_order(self, epoch: int, *, seed: int) -> list[int]:
        return self.orders[min(epoch, len(self.orders) - 1)]


def test_a_stream_of_too_few_distinct_tasks_fails_with_the_numbers_instead_of_spinning() -> None:
    from mcprl_train.errors import ConfigError
    from mcprl_train.loop.task_stream import TaskStream

    stream = TaskStream(_Tasks("abab", [[0, 1, 2, 3]]), seed=0)
    assert sorted(t.id for t in stream.take(2)) == ["a", "b"]
    with pytest.raises(ConfigError, match=r"2 distinct task ids, fewer than the 3 one step takes"):
        stream.take(3)


def test_a_stream_fills_a_step_across_an_epoch_boundary() -> None:
    from mcprl_train.loop.task_stream import StreamPosition, TaskStream

    stream = TaskStream(_Tasks("ABC", [[0, 1, 2], [2, 0, 1]]), seed=0, position=StreamPosition(index=2))
    assert sorted(t.id for t in stream.take(3)) == ["A", "B", "C"]


def test_a_training_set_smaller_than_a_step_is_refused_before_the_model_loads(tmp_path: Path) -> None:
    from mcprl_train import build
    from mcprl_train.errors import ConfigError

    config = make_config(tmp_path, "small", task_file(tmp_path, n=3), "grpo.tasks_per_step=4")
    with pytest.raises(ConfigError, match=r"grpo.tasks_per_step=4: the training set .* has only 3 tasks"):
        build.load_tasks(config)
