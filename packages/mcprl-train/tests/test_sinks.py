from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from mcprl_train.config import Config
from mcprl_train.run.run_dir import RunDir
from mcprl_train.run.sinks import ConsoleSink, MetricKind, MetricsSink, Record, SinkGroup


def _config(*overrides: str) -> Config:
    return Config.load(overrides=["run.steps=10", "sft.enabled=true", "sft.steps=40", *overrides])


def test_console_logs_one_line_per_grpo_step_with_its_fields() -> None:
    record = {
        "stage": "grpo",
        "sft_step": 40,
        "rollout/reward_mean": 0.51234,
        "rollout/success_rate": 0.5,
        "loss/kl": 0.001234,
        "tools/error_rate": 0.25,
        "rollout/invalid_rate": 0.0625,
        "rollout/pre_retry/invalid_rate": 0.4375,
        "rollout/retried_groups": 2.0,
        "adv/zero_std_frac": 0.125,
        "ratio/clip_frac": 0.0,
        "perf/step_s": 3.21,
        "time/elapsed_s": 99.6,
    }
    with capture_logs() as logs:
        ConsoleSink(_config()).write_metrics("grpo", 3, record)
    assert logs == [
        {
            "event": "grpo_step",
            "log_level": "info",
            "step": "3/10",
            "reward": 0.512,
            "success": 0.5,
            "kl": 0.0012,
            "tool_errors": 0.25,
            "invalid": 0.062,
            "invalid_pre_retry": 0.438,
            "retried_groups": 2,
            "zero_std": 0.12,
            "clip": 0.0,
            "step_s": 3.2,
            "elapsed_s": 100.0,
            "eta_s": 22,  # 7 steps left at 3.21 s
        }
    ]


def test_console_logs_every_twentieth_of_the_warm_start_and_its_last_step() -> None:
    console = ConsoleSink(_config(), sft_steps=45)
    with capture_logs() as logs:
        for step in range(1, 46):
            record = {"stage": "sft", "sft_step": step, "sft/loss": 1.0, "sft/token_acc": 0.5}
            console.write_metrics("sft", 0, {**record, "time/elapsed_s": 1.0})
    assert [log["step"] for log in logs] == [f"{s}/45" for s in (*range(2, 45, 2), 45)]
    assert set(logs[0]) == {
        "event",
        "log_level",
        "step",
        "loss",
        "token_acc",
        "turn_acc",
        "elapsed_s",
        "eta_s",
    }


def test_the_eta_is_the_steps_left_times_the_mean_step_time_so_far() -> None:
    console = ConsoleSink(_config(), sft_steps=40)
    with capture_logs() as logs:
        for step, seconds in zip(range(1, 41), [10.0, 30.0] * 20, strict=True):
            record = {"stage": "sft", "sft_step": step, "perf/sft_step_s": seconds}
            console.write_metrics("sft", 0, record)
        console.write_metrics("grpo", 1, {"perf/step_s": 5.0})
        console.write_metrics("grpo", 2, {"perf/step_s": 7.0})
    etas = [(log["step"], log["eta_s"]) for log in logs]
    # step 2: 38 left at 20 s; step 4: 36 at 20 s; the GRPO stage keeps its own mean (5 s, then 6 s).
    assert etas[:2] == [("2/40", 760), ("4/40", 720)]
    assert etas[-3:] == [("40/40", 0), ("1/10", 45), ("2/10", 48)]


def test_console_logs_a_validation_with_its_tag_and_task_count() -> None:
    record = {"stage": "grpo", "sft_step": 0, "tag": "final", "val/success_rate": 0.75, "val/groups": 8.0}
    with capture_logs() as logs:
        ConsoleSink(_config()).write_metrics("eval", 10, record)
    [log] = logs
    assert (log["event"], log["tag"], log["step"], log["success"], log["tasks"]) == (
        "validation",
        "final",
        10,
        0.75,
        8,
    )


def test_console_logs_the_summarys_known_fields() -> None:
    with capture_logs() as logs:
        ConsoleSink(_config()).write_summary({"steps": 10, "resumed_from": None})
    assert logs == [{"event": "run_finished", "log_level": "info", "steps": 10}]


def test_a_warm_start_by_epochs_needs_its_length() -> None:
    with pytest.raises(ValueError, match="pass sft_steps"):
        ConsoleSink(_config("sft.steps=null"))
    assert ConsoleSink(_config("sft.steps=null"), sft_steps=7).sft_steps == 7


def test_the_run_dir_writes_records_episodes_and_the_summary(tmp_path: Path) -> None:
    run_dir = RunDir.create(Config.load(overrides=[f"run.output_dir={tmp_path}", "run.name=r"]))
    sink: MetricsSink = run_dir
    sink.write_metrics("eval", 2, {"stage": "grpo", "sft_step": 0, "tag": "final", "val/success_rate": 0.5})
    sink.write_episodes(2, [{"episode_id": "a", "reward": 1.0}])
    sink.write_summary({"steps": 2, "success_final": 0.5, "resumed_from": None})
    [metrics] = run_dir.read_metrics().records
    assert {k: v for k, v in metrics.items() if k != "time"} == {
        "run": "r",
        "kind": "eval",
        "step": 2,
        "stage": "grpo",
        "sft_step": 0,
        "tag": "final",
        "val/success_rate": 0.5,
    }
    assert run_dir.read_trajectories().records == [{"run": "r", "step": 2, "episode_id": "a", "reward": 1.0}]
    assert json.loads(run_dir.summary_path.read_text()) == {
        "steps": 2,
        "success_final": 0.5,
        "resumed_from": None,
    }


class _Recorder:
    def __init__(self) -> None:
        self.calls: list[tuple[object, ...]] = []

    def write_metrics(self, kind: MetricKind, step: int, record: Record) -> None:
        self.calls.append(("metrics", kind, step, dict(record)))

    def write_episodes(self, step: int, episodes: Sequence[Mapping[str, object]]) -> None:
        self.calls.append(("episodes", step, len(episodes)))

    def write_summary(self, summary: Mapping[str, object]) -> None:
        self.calls.append(("summary", dict(summary)))


def test_a_sink_group_passes_every_call_to_every_sink_in_order() -> None:
    first, second = _Recorder(), _Recorder()
    group = SinkGroup([first, second])
    group.write_metrics("grpo", 1, {"loss/policy": 0.5})
    group.write_episodes(1, [{"episode_id": "a"}])
    group.write_summary({"steps": 1})
    expected = [
        ("metrics", "grpo", 1, {"loss/policy": 0.5}),
        ("episodes", 1, 1),
        ("summary", {"steps": 1}),
    ]
    assert first.calls == second.calls == expected
