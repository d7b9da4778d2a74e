"""Record/replay from the config: a real run records its tool calls, other runs and `eval` replay them offline.

The recording run is the tiny model warm-started on the demo's quote and post-quote tasks, talking to the real
``finance`` and ``messaging`` stdio servers. The replaying run differs where the old episode-keyed cassettes
could not follow: it starts from the recording's warm-start checkpoint instead of training one, so its
evaluations run under other episode ids, and it starts no server at all.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import structlog
import yaml

import mcprl_tasks
from mcprl_train.cassettes import record_path, tool_manager
from mcprl_train.cli import main
from mcprl_train.config import Config
from mcprl_train.errors import TrainError
from mcprl_train.loop.trainer import Trainer
from mcprl_train.run.run_dir import RunDir

QUOTE_SYMBOL_OF_TASK_00788 = "GRCR"


@pytest.fixture(autouse=True)
def _reset_structlog() -> Iterator[None]:
    yield
    from mcprl_train.run.tracking import configure_logging

    configure_logging(json_output=True)
    structlog.reset_defaults()


def server_children() -> list[int]:
    """PIDs of this process's children running a bundled MCP server (``python -m mcprl_servers.…``)."""
    found: list[int] = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        parent = int(stat.rsplit(")", 1)[1].split()[1])
        if parent == os.getpid() and b"mcprl_servers" in cmdline:
            found.append(int(entry))
    return found


class ServerWatch:
    """Hook: the most bundled-server processes seen while rollouts ran."""

    def __init__(self) -> None:
        self.most = 0

    def __call__(self, event: str, trainer: Trainer) -> None:
        if event == "after_rollout":
            self.most = max(self.most, len(server_children()))


def write_tasks(path: Path) -> Path:
    train, _ = mcprl_tasks.load_preset("demo")
    raw = mcprl_tasks.read_tasks(train)
    quote = [t for t in raw if t["metadata"]["family"] == "quote"][:2]
    post = [t for t in raw if t["metadata"]["family"] == "post_quote"][:1]
    path.write_text(json.dumps(quote + post))
    return path


def overrides(root: Path, name: str, tasks: Path, *extra: str) -> list[str]:
    return [
        f"run.name={name}",
        f"run.output_dir={root / 'runs'}",
        "run.steps=2",
        "run.checkpoint_every=2",
        "run.seed=3",
        f"tasks.train={tasks}",
        f"tasks.validation={tasks}",
        "tools.offline=[finance, messaging]",
        "tools.allow_tools={finance: [get_quote], messaging: [post_message, read_messages]}",
        "sft.enabled=true",
        "sft.steps=60",
        "sft.lr=3e-3",
        "sft.demos=3",
        "sft.batch_size=3",
        "sft.teacher_noise=0.0",
        "grpo.group_size=2",
        "grpo.tasks_per_step=2",
        "grpo.ppo_epochs=1",
        "grpo.minibatches=2",
        "grpo.filter_zero_std=false",
        "collection.overlap=false",  # two minibatches recompute π_old
        "env.max_new_tokens_per_turn=48",
        "env.max_turns_by_difficulty={easy: 2, medium: 3, hard: 3}",
        "collection.max_concurrent_episodes=1",
        "eval.every=2",
        "eval.n_tasks=3",
        "optim.warmup_steps=0",
        "tracking.progress=false",
        *extra,
    ]


def run(root: Path, name: str, tasks: Path, *extra: str) -> tuple[RunDir, ServerWatch]:
    config = Config.load("cpu", overrides=overrides(root, name, tasks, *extra))
    run_dir = RunDir.create(config)
    watch = ServerWatch()
    Trainer(config, run_dir, hooks=(watch,)).run()
    return run_dir, watch


def replay_overrides(recorded: RunDir, cassette: Path) -> list[str]:
    """Another run: the recording's warm-start weights, no warm start, one step; the servers replayed."""
    warm = recorded.path / "checkpoints" / "step-00000000" / "policy"
    return [
        f"tools.replay={cassette}",
        "sft.enabled=false",
        f"model.name={warm}",
        "run.steps=1",
        "run.max_invalid_rate=1.0",
    ]


def grpo_records(run_dir: RunDir) -> list[dict[str, Any]]:
    return [r for r in run_dir.read_metrics().records if r.get("kind") == "grpo"]


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, RunDir, ServerWatch]:
    """The recording run: ``(root, tasks, run directory, server watch)``; its cassette is ``calls.jsonl``."""
    root = tmp_path_factory.mktemp("replay")
    tasks = write_tasks(root / "tasks.json")
    run_dir, watch = run(root, "recorded", tasks, "tools.record=calls.jsonl")
    return root, tasks, run_dir, watch


@pytest.mark.slow
def test_a_recorded_run_replays_in_another_run_with_no_server_and_no_miss(
    recorded: tuple[Path, Path, RunDir, ServerWatch],
) -> None:
    root, tasks, rec_dir, rec_watch = recorded
    cassette = rec_dir.path / "calls.jsonl"
    assert rec_watch.most == 2  # finance and messaging ran while the recording run collected
    calls = [json.loads(line) for line in cassette.read_text().splitlines()[1:]]
    assert {c["tool"] for c in calls} >= {"get_quote", "read_messages"}  # the model's calls and the checker's
    assert yaml.safe_load((rec_dir.path / "config.yaml").read_text())["tools"]["record"] == "calls.jsonl"

    rep_dir, rep_watch = run(root, "replayed", tasks, *replay_overrides(rec_dir, cassette))
    assert rep_watch.most == 0
    assert server_children() == []
    assert yaml.safe_load((rep_dir.path / "config.yaml").read_text())["tools"]["replay"] == str(cassette)
    [step] = grpo_records(rep_dir)
    assert step["tools/replay/misses"] == 0
    assert step["tools/replay/hits"] > 0
    assert step["tools/step/infra_errors"] == 0
    assert not (rep_dir.path / "replay_misses.jsonl").exists()
    episodes = rep_dir.read_trajectories().records
    assert episodes
    assert all(e["valid"] for e in episodes)
    assert sum(e["metrics"]["tool_calls_ok"] for e in episodes) > 0  # the model's own calls were served


@pytest.mark.slow
def test_a_call_missing_from_the_cassette_is_counted_and_reported_not_fatal(
    recorded: tuple[Path, Path, RunDir, ServerWatch],
) -> None:
    root, tasks, rec_dir, _ = recorded
    lines = (rec_dir.path / "calls.jsonl").read_text().splitlines(keepends=True)
    needle = f'"symbol": "{QUOTE_SYMBOL_OF_TASK_00788}"'
    kept = [line for line in lines if needle not in line]
    assert len(kept) < len(lines)
    cut = root / "cut.jsonl"
    cut.write_text("".join(kept))

    rep_dir, _ = run(root, "missing", tasks, *replay_overrides(rec_dir, cut))
    [step] = grpo_records(rep_dir)
    assert step["tools/replay/misses"] > 0
    assert step["tools/step/infra_errors"] >= step["tools/replay/misses"]
    report = [json.loads(line) for line in (rep_dir.path / "replay_misses.jsonl").read_text().splitlines()]
    assert {r["tool"] for r in report} == {"finance.get_quote"}
    assert all(QUOTE_SYMBOL_OF_TASK_00788 in r["arguments"] for r in report)
    assert all("quote-train-00788" in r["episode_id"] for r in report)
    invalid = [e for e in rep_dir.read_trajectories().records if not e["valid"]]
    assert invalid
    assert all("quote-train-00788" in e["episode_id"] for e in invalid)


@pytest.mark.slow
def test_eval_replays_a_checkpoint_of_the_recorded_run(
    recorded: tuple[Path, Path, RunDir, ServerWatch], capsys: pytest.CaptureFixture[str]
) -> None:
    _, _, rec_dir, _ = recorded
    checkpoint = rec_dir.path / "checkpoints" / "step-00000000"
    cassette = rec_dir.path / "calls.jsonl"
    recorded_ids = {json.loads(line)["episode_id"] for line in cassette.read_text().splitlines()[1:]}
    assert not any(
        i.startswith("eval-step-00000000/") for i in recorded_ids
    )  # eval's own ids: never recorded
    args = ["eval", "--checkpoint", str(checkpoint), "--set", "tools.record=null"]
    assert main([*args, "--set", f"tools.replay={cassette}"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["tools/replay/misses"] == 0
    assert summary["tools/replay/hits"] > 0
    assert server_children() == []


def test_a_missing_replay_cassette_is_one_line_before_any_run_exists(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    args = ["train", "--run-name", "r", "--set", f"run.output_dir={tmp_path / 'runs'}"]
    assert main([*args, "--set", f"tools.replay={tmp_path / 'nope.jsonl'}"]) == 2
    err = capsys.readouterr().err
    [line] = [line for line in err.splitlines() if line.startswith("error:")]
    assert line.startswith(f"error: {tmp_path / 'nope.jsonl'}: cannot read cassette")
    assert not (tmp_path / "runs" / "r").exists()


def test_a_corrupt_replay_cassette_names_the_file_and_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    cassette = tmp_path / "old.jsonl"
    cassette.write_text('{"type": "catalogue", "tools": []}\n')
    args = ["train", "--set", f"run.output_dir={tmp_path / 'runs'}", "--set", f"tools.replay={cassette}"]
    assert main(args) == 2
    [line] = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert line.startswith(f"error: {cassette}:1: cassette format version 1")


def test_record_and_replay_together_are_a_config_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["config", "--set", "tools.record=a.jsonl", "--set", "tools.replay=b.jsonl"]) == 2
    assert "tools.record ('a.jsonl') and tools.replay ('b.jsonl') are exclusive" in capsys.readouterr().err


def test_the_saved_config_keeps_record_and_replay(tmp_path: Path) -> None:
    recording = Config.load("cpu", overrides=["tools.record=calls.jsonl"])
    again = Config.from_dict(yaml.safe_load(recording.to_yaml()))
    assert (again.tools.record, again.tools.replay) == ("calls.jsonl", None)
    assert record_path(again, tmp_path) == tmp_path / "calls.jsonl"
    absolute = recording.replace([f"tools.record={tmp_path / 'elsewhere.jsonl'}"])
    assert record_path(absolute, tmp_path / "run") == tmp_path / "elsewhere.jsonl"


def test_recording_from_several_processes_is_refused(tmp_path: Path) -> None:
    config = Config.load("cpu", overrides=["tools.record=calls.jsonl"])
    with pytest.raises(TrainError, match="recording needs a single-process run"):
        tool_manager(config, tmp_path, world_size=2)
