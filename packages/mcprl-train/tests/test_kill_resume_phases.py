"""The kill harness's own parts: where a kill landed, and what counts as two equal runs."""

from __future__ import annotations

import json
from pathlib import Path

from mcprl_train.config import Config
from mcprl_train.run.compare import run_differences
from mcprl_train.run.kill_resume import landed_phase
from mcprl_train.run.run_dir import RunDir


def _run(tmp_path: Path, name: str = "r") -> RunDir:
    return RunDir.create(
        Config.load(overrides=[f"run.output_dir={tmp_path}", f"run.name={name}", "run.steps=3"])
    )


def _log(run: RunDir, *events: dict[str, object]) -> None:
    with run.log_path.open("a") as handle:
        handle.writelines(json.dumps(e) + "\n" for e in events)


def test_before_the_run_directory_is_startup(tmp_path: Path) -> None:
    assert landed_phase(tmp_path / "nothing", 0, set()) == "startup: before the run directory"


def test_a_new_temporary_checkpoint_directory_is_a_checkpoint_write(tmp_path: Path) -> None:
    run = _run(tmp_path)
    (run.checkpoints.root / ".tmp-step-00000001-1-2").mkdir(parents=True)
    assert landed_phase(run.path, 0, set()).startswith("checkpoint write")
    assert not landed_phase(run.path, 0, {".tmp-step-00000001-1-2"}).startswith("checkpoint write")


def test_a_torn_line_names_the_file(tmp_path: Path) -> None:
    run = _run(tmp_path)
    run.trajectories_path.write_text('{"step": 1}\n{"st')
    assert landed_phase(run.path, 0, set()) == "append to trajectories.jsonl (torn last line)"


def test_the_last_log_event_places_the_kill(tmp_path: Path) -> None:
    run = _run(tmp_path)
    _log(run, {"event": "mcp_server_ready"})
    assert landed_phase(run.path, 0, set()) == "startup: model, servers"
    _log(run, {"event": "sft_step", "step": "3/30"})
    assert landed_phase(run.path, 0, set()) == "warm start"
    _log(run, {"event": "checkpoint_saved", "step": 0})
    assert landed_phase(run.path, 0, set()) == "warm start"
    _log(run, {"event": "sft_step", "step": "30/30"})
    assert landed_phase(run.path, 0, set()) == "warm-start evaluation"
    _log(run, {"event": "validation", "tag": "warm_start"}, {"event": "checkpoint_saved", "step": 0})
    assert landed_phase(run.path, 0, set()) == "GRPO step 1: collection or update"
    _log(run, {"event": "grpo_step", "step": "1/3"})
    assert landed_phase(run.path, 0, set()) == "GRPO step 1: logging, trajectories, checkpoint"
    _log(run, {"event": "checkpoint_saved", "step": 3})
    assert landed_phase(run.path, 0, set()) == "final evaluation"
    _log(run, {"event": "validation", "tag": "final"}, {"event": "checkpoint_saved", "step": 3})
    assert landed_phase(run.path, 0, set()) == "final checkpoint written: summary"
    start = run.log_path.stat().st_size
    _log(run, {"event": "resumed", "stage": "sft", "step": 0})
    assert landed_phase(run.path, start, set()) == "warm start"


def _finished(tmp_path: Path, name: str, logprob: float, reward: float = 1.0, blob: bytes = b"w") -> Path:
    run = _run(tmp_path, name)
    run.write_metrics("grpo", 1, {"loss/policy": 0.5, "perf/step_s": 1.0, "sampler/decode_calls": 3.0})
    episode = {
        "episode_id": "e0",
        "reward": reward,
        "sampler_logprobs": [logprob],
        "metrics": {"wall_s": 0.1},
    }
    run.append_trajectories(1, [episode])
    run.write_summary({"steps": 1, "elapsed_s": 3.0, "run_dir": str(run.path), "resumed_from": None})

    def weights(path: Path) -> None:
        (path / "model.safetensors").write_bytes(blob)

    run.checkpoints.save(1, writers={"policy": weights}, meta={"state": {"step": 1, "elapsed_s": 2.0}})
    return run.path


def test_equal_runs_differ_in_nothing_but_clocks_and_names(tmp_path: Path) -> None:
    a = _finished(tmp_path, "a", -0.5)
    b = _finished(tmp_path, "b", -0.5)
    assert run_differences(a, b) == []


def test_a_reward_or_a_weight_that_differs_is_reported(tmp_path: Path) -> None:
    a = _finished(tmp_path, "a", -0.5)
    b = _finished(tmp_path, "b", -0.5, reward=0.0)
    assert run_differences(a, b, exact=False) == ["1 episodes differ, e.g. [(1, 'e0', 0)]"]
    c = _finished(tmp_path, "c", -0.5, blob=b"other")
    assert run_differences(a, c) == ["final weights differ: ['policy/model.safetensors']"]


def test_logprobs_within_the_batching_tolerance_are_equal_only_when_not_exact(tmp_path: Path) -> None:
    a = _finished(tmp_path, "a", -0.5)
    b = _finished(tmp_path, "b", -0.5 + 2e-6)
    assert run_differences(a, b, exact=False) == []
    assert run_differences(a, b) == ["1 episodes differ, e.g. [(1, 'e0', 0)]"]
