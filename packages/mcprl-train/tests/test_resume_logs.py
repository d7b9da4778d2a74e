"""A resume cuts the logs where its checkpoint was saved, not at its step; the summary covers the whole run."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import cast

import pytest
from run_compare import run_differences

from mcprl_env import Environment, Task, task_from_dict
from mcprl_env.testing import CharTokenizer, ScriptedSampler
from mcprl_tools import ToolManager
from mcprl_train.config import Config
from mcprl_train.loop.collection import tool_step_metrics
from mcprl_train.loop.rollouts import Rollouts
from mcprl_train.loop.trainer import Trainer
from mcprl_train.run.run_dir import RunDir
from mcprl_train.run.sinks import MetricKind, Record, SinkGroup


def _run(tmp_path: Path) -> RunDir:
    return RunDir(tmp_path / "run")


def _kinds(run: RunDir) -> list[tuple[str, int, object]]:
    return [(r["kind"], r["step"], r.get("tag")) for r in run.read_metrics().records]


def test_records_logged_at_the_checkpoints_step_after_it_was_saved_are_dropped(tmp_path: Path) -> None:
    run = _run(tmp_path)
    run.path.mkdir()
    run.write_metrics("grpo", 3, {"loss": 1.0})
    marks = run.log_marks()
    run.write_metrics("eval", 3, {"tag": "final", "val/success_rate": 0.5})
    with run.metrics_path.open("ab") as handle:
        handle.write(b'{"run": "run", "kind": "ev')
    report = run.rewind(3, marks=marks)
    assert _kinds(run) == [("grpo", 3, None)]
    assert report.dropped["metrics.jsonl"] == 1
    assert "metrics.jsonl" in report.torn_lines


def test_without_marks_the_step_alone_keeps_a_record_logged_after_the_checkpoint(tmp_path: Path) -> None:
    """What the marks are for: by step, a final validation logged after the last checkpoint survives."""
    run = _run(tmp_path)
    run.path.mkdir()
    run.write_metrics("grpo", 3, {"loss": 1.0})
    run.write_metrics("eval", 3, {"tag": "final"})
    run.rewind(3)
    assert _kinds(run) == [("grpo", 3, None), ("eval", 3, "final")]


def test_warm_start_records_after_a_warm_start_checkpoint_are_dropped(tmp_path: Path) -> None:
    run = _run(tmp_path)
    run.path.mkdir()
    for sft_step in (1, 2):
        run.write_metrics("sft", 0, {"sft_step": sft_step})
    marks = run.log_marks()
    for sft_step in (3, 4):
        run.write_metrics("sft", 0, {"sft_step": sft_step})
    run.rewind(0, marks=marks)
    assert [r["sft_step"] for r in run.read_metrics().records] == [1, 2]


def test_trajectories_after_the_mark_are_dropped_and_can_be_written_again(tmp_path: Path) -> None:
    run = _run(tmp_path)
    run.path.mkdir()
    run.append_trajectories(1, [{"episode_id": "a"}])
    marks = run.log_marks()
    run.append_trajectories(2, [{"episode_id": "b"}])
    run.rewind(1, marks=marks)
    assert run.append_trajectories(2, [{"episode_id": "b"}]) == 1
    assert [(r["step"], r["episode_id"]) for r in run.read_trajectories().records] == [(1, "a"), (2, "b")]


def test_a_checkpoint_eval_appended_by_mcprl_train_eval_survives_a_rewind(tmp_path: Path) -> None:
    run = _run(tmp_path)
    run.path.mkdir()
    run.write_metrics("grpo", 3, {"loss": 1.0})
    marks = run.log_marks()
    run.write_metrics("eval", 3, {"tag": "final"})
    run.write_metrics("eval", 3, {"tag": "checkpoint_eval"})
    run.rewind(3, marks=marks)
    assert _kinds(run) == [("grpo", 3, None), ("eval", 3, "checkpoint_eval")]


def test_a_mark_that_is_not_at_a_line_end_falls_back_to_the_step(tmp_path: Path) -> None:
    run = _run(tmp_path)
    run.path.mkdir()
    run.write_metrics("grpo", 1, {"loss": 1.0})
    run.write_metrics("grpo", 2, {"loss": 1.0})
    run.rewind(1, marks={"metrics.jsonl": 5})
    assert _kinds(run) == [("grpo", 1, None)]


class Interrupted(Exception):
    """A crash right after the final validation is on disk, before the last checkpoint."""


class CrashAfterFinalValidation:
    def write_metrics(self, kind: MetricKind, step: int, record: Record) -> None:
        if kind == "eval" and record.get("tag") == "final":
            raise Interrupted

    def write_episodes(self, step: int, episodes: object) -> None: ...

    def write_summary(self, summary: object) -> None: ...


def _short_config(tmp_path: Path, name: str, *extra: str) -> Config:
    import mcprl_tasks

    train, _ = mcprl_tasks.load_preset("demo")
    tasks = tmp_path / "tasks.json"
    tasks.write_text(json.dumps(mcprl_tasks.read_tasks(train)[:4]))
    return Config.load(
        "cpu",
        overrides=[
            f"run.name={name}",
            f"run.output_dir={tmp_path / 'runs'}",
            "run.steps=1",
            "run.checkpoint_every=1",
            f"tasks.train={tasks}",
            f"tasks.validation={tasks}",
            "sft.steps=2",
            "sft.demos=4",
            "sft.batch_size=2",
            "grpo.group_size=2",
            "grpo.tasks_per_step=2",
            "env.max_new_tokens_per_turn=16",
            "env.template_date=2026-01-01",
            "eval.every=0",
            "tracking.progress=false",
            *extra,
        ],
    )


def _stop_in_the_warm_start(sft_step: int) -> Callable[[str, Trainer], None]:
    def hook(event: str, trainer: Trainer) -> None:
        if (
            event == "after_checkpoint"
            and trainer.state.stage == "sft"
            and trainer.state.sft_step == sft_step
        ):
            raise Interrupted

    return hook


@pytest.mark.slow
def test_a_run_cut_in_its_warm_start_resumes_there_and_equals_the_uninterrupted_run(tmp_path: Path) -> None:
    every = ("sft.steps=4", "sft.checkpoint_every=2")
    straight = _short_config(tmp_path, "straight", *every)
    Trainer(straight, RunDir.create(straight)).run()
    config = _short_config(tmp_path, "cut", *every)
    with pytest.raises(Interrupted):
        Trainer(config, RunDir.create(config), hooks=(_stop_in_the_warm_start(2),)).run()
    run = RunDir.open(tmp_path / "runs" / "cut")
    loaded = run.checkpoints.load_latest()
    assert loaded is not None
    assert (loaded.meta["state"]["stage"], loaded.meta["state"]["sft_step"]) == ("sft", 2)
    resumed = Trainer(config, run, resume=True)
    resumed.run()
    assert resumed.restored_from is not None  # the warm start went on from step 2, not from the start
    sft_steps = [r["sft_step"] for r in run.read_metrics().records if r["kind"] == "sft"]
    assert sft_steps == [1, 2, 3, 4]
    assert run_differences(tmp_path / "runs" / "straight", run.path) == []


@pytest.mark.slow
def test_a_run_cut_after_its_final_validation_resumes_to_one_final_record_and_a_whole_summary(
    tmp_path: Path,
) -> None:
    """The real trainer (tiny model, the demo's stdio servers): the cut falls between the final validation
    (logged at the last step) and the run's last checkpoint, the place a step-based rewind gets wrong."""
    config = _short_config(tmp_path, "cut")
    with pytest.raises(Interrupted):
        Trainer(config, RunDir.create(config), sinks=(CrashAfterFinalValidation(),)).run()
    run = RunDir.open(tmp_path / "runs" / "cut")
    assert [t for k, _, t in _kinds(run) if k == "eval"] == ["warm_start", "final"]
    summary = Trainer(config, run, resume=True).run()
    assert [t for k, _, t in _kinds(run) if k == "eval"] == ["warm_start", "final"]
    assert summary["success_warm_start"] is not None
    assert summary["success_final"] is not None
    assert json.loads(run.summary_path.read_text())["success_warm_start"] == summary["success_warm_start"]


class _ValidatingRollouts:
    """Validation that calls a real (in-memory MCP) tool server through the environment, with the libraries'
    scripted sampler standing in for a model that has learned to call tools (the tiny model needs a long warm
    start for that)."""

    def __init__(self, env: Environment, sampler: ScriptedSampler, task: Task) -> None:
        self.env, self.sampler, self.task = env, sampler, task

    async def validate(self, tasks: object, *, label: str, namespace: str) -> dict[str, float]:
        group = await self.env.run_group(self.task, self.sampler, group_size=2)
        return {"val/success_rate": sum(e.success for e in group.episodes) / 2}


@pytest.mark.anyio
async def test_a_validations_tool_calls_go_to_its_own_record_not_the_next_steps(tmp_path: Path) -> None:
    """Counted into the next GRPO step, they made that step's ``tools/step/calls`` depend on whether the run
    was resumed after the validation (a resumed process never ran it)."""
    from mcp.server.mcpserver import MCPServer

    server = MCPServer("calc")

    @server.tool(description="Add two integers.")
    def add(a: int, b: int) -> int:  # pyright: ignore[reportUnusedFunction]
        return a + b

    tok = CharTokenizer()
    task = task_from_dict({"id": "t", "prompt": "1+2?", "answer": "3"})
    turns = ['<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>', "<answer>3</answer>"]
    config = Config.load(overrides=[f"run.output_dir={tmp_path}", "run.name=r"])
    run = RunDir.create(config)
    trainer = Trainer(config, run)
    trainer.sinks = SinkGroup([run])
    trainer.val_tasks = [task]
    async with ToolManager.in_memory({"calc": server}) as manager:
        env = Environment(manager=manager, tokenizer=tok)
        trainer.rollouts = cast("Rollouts", _ValidatingRollouts(env, ScriptedSampler(tok, turns), task))
        await trainer.evaluate("warm_start")
        next_step = tool_step_metrics(env)
    (record,) = run.read_metrics().records
    assert record["val/success_rate"] == 1.0
    assert record["val/tools/step/calls"] == 2
    assert next_step["tools/step/calls"] == 0
