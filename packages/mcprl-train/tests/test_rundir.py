from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from mcprl_train.config import Config
from mcprl_train.errors import RunDirError
from mcprl_train.run.run_dir import RunDir, read_jsonl


def _config(tmp_path: Path, name: str = "r1") -> Config:
    return Config.load(overrides=[f"run.output_dir={tmp_path}", f"run.name={name}", "run.keep_checkpoints=2"])


def _episodes(step: int, n: int = 3) -> list[dict[str, object]]:
    return [{"episode_id": f"s{step}-e{i}", "reward": float(i), "success": i % 2 == 0} for i in range(n)]


def test_create_writes_the_resolved_config_and_open_reads_it_back(tmp_path: Path) -> None:
    config = _config(tmp_path)
    run_dir = RunDir.create(config)
    assert run_dir.path == tmp_path / "r1"
    assert RunDir.open(run_dir.path).load_config() == config
    assert run_dir.checkpoints.keep == 2


def test_create_refuses_a_directory_that_holds_a_run(tmp_path: Path) -> None:
    RunDir.create(_config(tmp_path))
    with pytest.raises(RunDirError, match="already holds a run; resume it with --resume"):
        RunDir.create(_config(tmp_path))


def test_open_refuses_a_directory_without_config(tmp_path: Path) -> None:
    with pytest.raises(RunDirError, match="not a run directory"):
        RunDir.open(tmp_path)


def test_default_run_name_is_profile_and_timestamp(tmp_path: Path) -> None:
    run_dir = RunDir.create(Config.load(overrides=[f"run.output_dir={tmp_path}"]))
    assert run_dir.name.startswith("cpu-")


def test_metrics_and_trajectories_round_trip_with_run_and_step(tmp_path: Path) -> None:
    run_dir = RunDir.create(_config(tmp_path))
    run_dir.write_metrics("grpo", 1, {"loss/policy": 0.5, "reward/mean": 0.25})
    run_dir.write_metrics("eval", 1, {"val/success_rate": 0.5})
    assert run_dir.append_trajectories(1, _episodes(1)) == 3
    metrics = run_dir.read_metrics().records
    assert [(m["kind"], m["step"]) for m in metrics] == [("grpo", 1), ("eval", 1)]
    assert metrics[0]["loss/policy"] == 0.5
    trajectories = run_dir.read_trajectories().records
    assert [(t["run"], t["step"], t["episode_id"]) for t in trajectories] == [
        ("r1", 1, f"s1-e{i}") for i in range(3)
    ]


def test_duplicate_episodes_are_dropped_also_after_reopening(tmp_path: Path) -> None:
    run_dir = RunDir.create(_config(tmp_path))
    run_dir.append_trajectories(1, _episodes(1))
    assert run_dir.append_trajectories(1, _episodes(1, n=4)) == 1
    assert RunDir.open(run_dir.path).append_trajectories(1, _episodes(1, n=5)) == 1
    assert len(run_dir.read_trajectories().records) == 5


def test_a_record_without_episode_id_is_rejected(tmp_path: Path) -> None:
    run_dir = RunDir.create(_config(tmp_path))
    with pytest.raises(RunDirError, match="without 'episode_id'"):
        run_dir.append_trajectories(1, [{"reward": 1.0}])


def test_torn_last_line_is_skipped_and_reported(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text('{"step": 1, "episode_id": "a"}\n{"step": 1, "episode_id": "b"}\n{"step": 2, "epis')
    result = read_jsonl(path)
    assert [r["episode_id"] for r in result.records] == ["a", "b"]
    assert result.torn_line == '{"step": 2, "epis'
    assert result.bad_lines == ()


def test_a_corrupt_middle_line_is_reported_separately(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text('{"a": 1}\nnot json\n{"a": 2}\n')
    result = read_jsonl(path)
    assert [r["a"] for r in result.records] == [1, 2]
    assert result.bad_lines == (2,)
    assert result.torn_line is None


def test_rewind_cuts_the_torn_line_and_drops_later_steps(tmp_path: Path) -> None:
    run_dir = RunDir.create(_config(tmp_path))
    for step in (1, 2, 3):
        run_dir.write_metrics("grpo", step, {"reward/mean": float(step)})
        run_dir.append_trajectories(step, _episodes(step))
    with run_dir.trajectories_path.open("a") as handle:
        handle.write('{"run": "r1", "step": 4, "episode_id": "s4-')
    with capture_logs() as logs:
        report = RunDir.open(run_dir.path).rewind(2)
    assert report.torn_lines == {"trajectories.jsonl": '{"run": "r1", "step": 4, "episode_id": "s4-'}
    assert report.dropped == {"metrics.jsonl": 1, "trajectories.jsonl": 3}
    assert "torn_line_skipped" in {e["event"] for e in logs}
    assert run_dir.trajectories_path.read_bytes().endswith(b"\n")
    assert {r["step"] for r in run_dir.read_trajectories().records} == {1, 2}
    resumed = RunDir.open(run_dir.path)
    assert resumed.append_trajectories(3, _episodes(3)) == 3  # step 3 runs again after the rewind
    assert resumed.rewind(3).clean


_HEAVY_APPENDER = textwrap.dedent(
    """
    import sys
    from mcprl_train.run.run_dir import RunDir

    run_dir = RunDir.open(sys.argv[1])
    payload = "x" * 20000
    step = 0
    while True:
        step += 1
        run_dir.append_trajectories(step, [{"episode_id": f"e{i}", "text": payload} for i in range(16)])
        run_dir.write_metrics("grpo", step, {"reward/mean": 1.0})
        if step == 5:
            print("APPENDED", flush=True)
    """
)


def test_kill_during_heavy_appends_leaves_readable_logs_and_no_duplicates_after_resume(
    tmp_path: Path,
) -> None:
    run_dir = RunDir.create(_config(tmp_path))
    proc = subprocess.Popen(
        [sys.executable, "-c", _HEAVY_APPENDER, str(run_dir.path)], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    try:
        assert any(line.strip() == "APPENDED" for line in iter(proc.stdout.readline, ""))
    finally:
        proc.kill()
        proc.wait(timeout=60)
        proc.stdout.close()
    before = run_dir.read_trajectories()
    assert before.bad_lines == ()
    last_complete = max(r["step"] for r in run_dir.read_metrics().records)
    resumed = RunDir.open(run_dir.path)
    resumed.rewind(last_complete - 1)
    for step in (last_complete, last_complete + 1):
        resumed.append_trajectories(step, [{"episode_id": f"e{i}", "text": "again"} for i in range(16)])
    records = resumed.read_trajectories()
    assert records.torn_line is None
    assert records.bad_lines == ()
    keys = [(r["run"], r["step"], r["episode_id"]) for r in records.records]
    assert len(keys) == len(set(keys)) == 16 * (last_complete + 1)
