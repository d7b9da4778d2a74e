from __future__ import annotations

import importlib.util
import json
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import structlog
from train_testkit import shared_wandb_service, wandb_offline_env

from mcprl_train.config import Config
from mcprl_train.errors import TrackingError
from mcprl_train.run.run_dir import RunDir
from mcprl_train.run.tracking import Tracker, configure_logging, resolve_wandb_mode

_HINT = "the tracking extra is not installed: pip install 'mcprl-train[tracking]'"
needs_wandb = pytest.mark.skipif(importlib.util.find_spec("wandb") is None, reason=_HINT)
needs_weave = pytest.mark.skipif(importlib.util.find_spec("weave") is None, reason=_HINT)


@pytest.fixture(autouse=True)
def _reset_structlog() -> Iterator[None]:
    yield
    configure_logging(json_output=True)  # closes the test's log file
    structlog.reset_defaults()


@pytest.mark.parametrize(
    ("setting", "env", "mode"),
    [
        ("auto", {}, "offline"),
        ("auto", {"WANDB_API_KEY": "k"}, "online"),
        ("auto", {"WANDB_API_KEY": "k", "WANDB_MODE": "disabled"}, "disabled"),
        ("auto", {"WANDB_MODE": "dryrun"}, "offline"),
        ("offline", {"WANDB_API_KEY": "k"}, "offline"),
        ("disabled", {"WANDB_API_KEY": "k"}, "disabled"),
    ],
)
def test_wandb_mode_is_offline_without_a_key_and_online_with_one(
    setting: str, env: dict[str, str], mode: str
) -> None:
    assert resolve_wandb_mode(setting, env) == mode


def test_logging_writes_json_lines_to_stderr_and_the_training_log(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log_file = tmp_path / "training.log"
    configure_logging(level="info", log_file=log_file, json_output=True)
    log = structlog.get_logger()
    log.debug("hidden_event")
    log.info("step_done", step=3, reward=0.5)
    err = capsys.readouterr().err.strip().splitlines()
    assert [json.loads(line)["event"] for line in err] == ["step_done"]
    record = json.loads(log_file.read_text().strip())
    assert (record["event"], record["step"], record["level"]) == ("step_done", 3, "info")
    assert "timestamp" in record


def test_console_rendering_is_not_json(capsys: pytest.CaptureFixture[str]) -> None:
    configure_logging(json_output=False)
    structlog.get_logger().info("hello_console", x=1)
    err = capsys.readouterr().err
    assert "hello_console" in err
    with pytest.raises(json.JSONDecodeError):
        json.loads(err)


def _run_dir(tmp_path: Path, *overrides: str) -> tuple[Config, RunDir]:
    config = Config.load(overrides=[f"run.output_dir={tmp_path}", "run.name=t", *overrides])
    return config, RunDir.create(config)


def test_weave_without_a_key_is_a_clear_error(tmp_path: Path) -> None:
    config, run_dir = _run_dir(tmp_path, "tracking.weave=true", "tracking.wandb=disabled")
    with pytest.raises(TrackingError, match="WANDB_API_KEY is not set: weave has no offline mode"):
        Tracker(config, run_dir).start(env={})


class _FakeWandbRun:
    """A wandb run's logging surface (the real one needs a service; see the tests below for the real thing)."""

    def __init__(self, fail: BaseException | None = None) -> None:
        self.logged: list[tuple[int, dict[str, float]]] = []
        self.summary: dict[str, object] = {}
        self.fail = fail

    def log(self, data: dict[str, float], *, step: int) -> None:
        if self.fail is not None:
            raise self.fail
        self.logged.append((step, data))


@needs_wandb
def test_a_wandb_run_lost_mid_run_is_dropped_with_one_warning_and_the_run_goes_on(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from wandb.errors import CommError

    configure_logging(json_output=True)
    config, run_dir = _run_dir(tmp_path, "tracking.wandb=disabled")
    tracker = Tracker(config, run_dir)
    tracker._wandb_run = _FakeWandbRun(fail=CommError("the service went away"))  # pyright: ignore[reportPrivateUsage]
    tracker.write_metrics("grpo", 1, {"stage": "grpo", "sft_step": 0, "loss/policy": 0.25})
    tracker.write_metrics("grpo", 2, {"stage": "grpo", "sft_step": 0, "loss/policy": 0.25})
    tracker.write_summary({"steps": 2})
    tracker.finish()
    events = [json.loads(line) for line in capsys.readouterr().err.splitlines()]
    assert [(e["event"], e["error"]) for e in events] == [("wandb_log_failed", "the service went away")]
    assert tracker.wandb_mode == "disabled"


def test_metrics_records_reach_wandb_under_stable_keys(tmp_path: Path) -> None:
    config, run_dir = _run_dir(tmp_path, "tracking.wandb=disabled")
    tracker = Tracker(config, run_dir)
    tracker._wandb_run = run = _FakeWandbRun()  # pyright: ignore[reportPrivateUsage]
    tracker.write_metrics("grpo", 2, {"stage": "grpo", "sft_step": 5, "loss/policy": 0.25})
    tracker.write_metrics("sft", 0, {"stage": "sft", "sft_step": 3, "sft/loss": 1.5})
    tracker.write_metrics(
        "eval", 2, {"stage": "grpo", "sft_step": 5, "tag": "final", "val/success_rate": 0.5}
    )
    assert run.logged == [
        (2, {"step": 2, "sft_step": 5, "loss/policy": 0.25}),
        (0, {"sft/step": 0, "sft/sft_step": 3, "sft/loss": 1.5}),
        (2, {"eval/step": 2, "eval/sft_step": 5, "val/success_rate": 0.5}),
    ]
    tracker.write_summary({"steps": 2, "success_final": 0.5, "resumed_from": None})
    assert run.summary == {"steps": 2, "success_final": 0.5}


@needs_weave
def test_disabled_weave_traces_each_episode_with_its_run_and_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WEAVE_DISABLED", "true")
    config, run_dir = _run_dir(tmp_path, "tracking.weave=true", "tracking.wandb=disabled")
    tracker = Tracker(config, run_dir).start()
    op = tracker._weave_op  # pyright: ignore[reportPrivateUsage]
    traced: list[dict[str, object]] = []

    def spy(record: dict[str, object]) -> object:
        traced.append(record)
        return op(record)

    tracker._weave_op = spy  # pyright: ignore[reportPrivateUsage]
    tracker.write_episodes(1, [{"episode_id": "a", "reward": 1.0}, {"episode_id": "b", "reward": 0.0}])
    assert traced == [
        {"run": "t", "step": 1, "episode_id": "a", "reward": 1.0},
        {"run": "t", "step": 1, "episode_id": "b", "reward": 0.0},
    ]
    assert not run_dir.trajectories_path.exists()  # the tracker reads no file
    tracker.finish()


@needs_wandb
def test_offline_wandb_receives_the_trainer_metrics(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.setenv("WANDB_SILENT", "true")
    config, run_dir = _run_dir(tmp_path)
    tracker = Tracker(config, run_dir).start()
    assert tracker.wandb_mode == "offline"
    tracker.write_metrics("grpo", 1, {"stage": "grpo", "sft_step": 0, "loss/policy": 0.25})
    tracker.write_metrics(
        "eval", 1, {"stage": "grpo", "sft_step": 0, "tag": "final", "val/success_rate": 0.5}
    )
    tracker.write_summary({"steps": 1, "success_final": 0.5})
    tracker.finish()
    runs = list((run_dir.path / "wandb").glob("offline-run-*"))
    assert len(runs) == 1
    assert list(runs[0].glob("*.wandb"))


_TRACKED_THEN = """
import os, signal, sys
from mcprl_train.run.run_dir import RunDir
from mcprl_train.run.tracking import Tracker, configure_logging
configure_logging(json_output=True)
run_dir = RunDir.open(sys.argv[1])
tracker = Tracker(run_dir.load_config(), run_dir).start()
tracker.write_metrics("grpo", int(sys.argv[2]), {"stage": "grpo", "sft_step": 0, "loss/policy": 0.5})
print(tracker.wandb_mode, tracker._wandb_run.id, flush=True)
if sys.argv[3] == "kill":
    os.kill(os.getpid(), signal.SIGKILL)
tracker.finish()
"""


@needs_wandb
@pytest.mark.timeout(300)
def test_a_run_killed_while_a_shared_wandb_service_holds_it_resumes_tracked_under_a_linked_id(
    tmp_path: Path,
) -> None:
    """A killed run's stream stays open in a shared wandb-core service; resuming it there must not fail."""
    _, run_dir = _run_dir(tmp_path)
    with shared_wandb_service() as service:
        env = wandb_offline_env(service)
        script = [sys.executable, "-c", _TRACKED_THEN, str(run_dir.path)]
        killed = subprocess.run([*script, "1", "kill"], env=env, capture_output=True, text=True, timeout=120)
        assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
        resumed = subprocess.run(
            [*script, "2", "finish"], env=env, capture_output=True, text=True, timeout=120
        )
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    first_id = killed.stdout.split()[1]
    mode, new_id = resumed.stdout.split()
    assert mode == "offline"
    assert new_id.startswith(f"{first_id}-")
    events = [json.loads(line) for line in resumed.stderr.splitlines() if line.startswith("{")]
    refused = [e for e in events if e["event"] == "wandb_resume_refused"]
    assert [(e["id"], "in use" in e["error"]) for e in refused] == [(first_id, True)], events
    assert "Traceback" not in resumed.stderr
    runs = sorted(p.name for p in (run_dir.path / "wandb").glob("offline-run-*"))
    names = [name for name in runs if name.endswith(f"-{new_id}")]
    assert len(names) == 1, runs
    assert runs[0].endswith(f"-{first_id}"), runs  # the killed run's files stay
    linked = run_dir.path / "wandb" / names[0]
    (records,) = linked.glob("*.wandb")  # offline, the config is a record of wandb's transaction log
    data = records.read_bytes()
    assert b"wandb_resumed_from" in data
    assert first_id.encode() in data
