"""Reproducible runs on the demo's real stdio servers: the same checkpoint gives the same episodes and metrics.

Episodes of a step run concurrently (16 at a time) through the batched HF sampler; each turn is sampled with a
seed derived from (run seed, step, episode id, turn), so what shares a batch, and in what order requests
arrive, does not change the tokens. The logits of a row are not bit-identical across batch compositions on
the CPU (padding and batch size change the reductions' order, ~1e-7), so runs that batch differently agree
on every token and reward, and on logprobs and metrics to ~1e-6 rather than bit for bit.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from train_testkit import (
    CHECKPOINT_EVERY_STEP,
    demo_tasks,
    shared_wandb_service,
    tiny_demo_run,
    wandb_offline_env,
)

from mcprl_train.config import Config
from mcprl_train.loop.trainer import Trainer
from mcprl_train.run.run_dir import RunDir

pytestmark = pytest.mark.slow

TIMING = ("run", "time", "time/", "perf/", "wall_s")
"""Metric keys that are clock readings (prefixes; and any key ending in ``_ms``, ``_s`` or ``_s_mean``, e.g. the
tools' queue waits and an episode's own and queued seconds)."""


def is_timing(key: str) -> bool:
    return key.startswith(TIMING) or key.endswith(("_ms", "_s", "_s_mean"))


def overrides(tmp_path: Path, name: str, tasks: Path) -> list[str]:
    return [*tiny_demo_run(tmp_path / "runs", name, tasks, steps=3), *CHECKPOINT_EVERY_STEP]


class Interrupted(Exception):
    """Raised by a hook right after a GRPO checkpoint (a crash at that point)."""


def stop_after_checkpoint(step: int) -> Any:
    def hook(event: str, trainer: Trainer) -> None:
        if event == "after_checkpoint" and trainer.state.stage == "grpo" and trainer.state.step == step:
            raise Interrupted

    return hook


def episodes(run: Path) -> dict[tuple[int, str], dict[str, Any]]:
    records = RunDir.open(run).read_trajectories().records
    return {(r["step"], r["episode_id"]): {k: v for k, v in r.items() if k != "run"} for r in records}


def step_metrics(run: Path) -> dict[int, dict[str, Any]]:
    records = RunDir.open(run).read_metrics().records
    return {
        r["step"]: {k: v for k, v in r.items() if not is_timing(k)} for r in records if r["kind"] == "grpo"
    }


def without_timing(episode: dict[str, Any]) -> dict[str, Any]:
    metrics = {k: v for k, v in episode["metrics"].items() if not is_timing(k)}
    return {**episode, "metrics": metrics}


def assert_identical_after(a: Path, b: Path, step: int) -> None:
    """Episodes and metrics of every step after ``step`` are equal, bit for bit (timings aside)."""
    ea, eb = episodes(a), episodes(b)
    later = sorted(k for k in ea if k[0] > step)
    assert later, "no episode after the checkpoint"
    assert later == sorted(k for k in eb if k[0] > step)
    differing = [k for k in later if without_timing(ea[k]) != without_timing(eb[k])]
    assert not differing, f"{len(differing)}/{len(later)} episodes differ, e.g. {differing[:3]}"
    ma, mb = step_metrics(a), step_metrics(b)
    for s in sorted(k for k in ma if k > step):
        assert ma[s] == mb[s], {k: (ma[s][k], mb[s].get(k)) for k in ma[s] if ma[s][k] != mb[s].get(k)}


def cut_run(tmp_path: Path, tasks: Path, name: str) -> Path:
    config = Config.load("cpu", overrides=overrides(tmp_path, name, tasks))
    with pytest.raises(Interrupted):
        Trainer(config, RunDir.create(config), hooks=(stop_after_checkpoint(1),)).run()
    return tmp_path / "runs" / name


def resume(tmp_path: Path, tasks: Path, run: Path, *extra: str) -> None:
    config = Config.load("cpu", overrides=[*overrides(tmp_path, run.name, tasks), *extra])
    Trainer(config, RunDir.open(run), resume=True).run()


def test_two_continuations_of_a_checkpoint_and_the_uninterrupted_run_agree_bit_for_bit(
    tmp_path: Path,
) -> None:
    tasks = demo_tasks(tmp_path / "tasks.json", 2)
    straight = Config.load("cpu", overrides=overrides(tmp_path, "straight", tasks))
    Trainer(straight, RunDir.create(straight)).run()
    first = cut_run(tmp_path, tasks, "cut")
    second = tmp_path / "runs" / "cut-copy"
    shutil.copytree(first, second)
    resume(tmp_path, tasks, first)
    resume(tmp_path, tasks, second)
    assert_identical_after(first, second, 1)
    assert_identical_after(first, tmp_path / "runs" / "straight", 1)


def test_a_continuation_that_batches_differently_samples_the_same_tokens(tmp_path: Path) -> None:
    """One request per forward pass instead of up to 128 with a 5 ms wait: other batches, other padding."""
    tasks = demo_tasks(tmp_path / "tasks.json", 2)
    first = cut_run(tmp_path, tasks, "cut")
    second = tmp_path / "runs" / "cut-copy"
    shutil.copytree(first, second)
    resume(tmp_path, tasks, first)
    resume(tmp_path, tasks, second, "sampler.max_batch_size=1", "sampler.max_wait_ms=0")
    ea, eb = episodes(first), episodes(second)
    later = sorted(k for k in ea if k[0] > 1)
    assert later == sorted(k for k in eb if k[0] > 1)
    for key in later:
        a, b = ea[key], eb[key]
        assert (a["token_ids"], a["messages"], a["reward"], a["stop_reason"]) == (
            b["token_ids"],
            b["messages"],
            b["reward"],
            b["stop_reason"],
        ), key
        gaps = [abs(x - y) for x, y in zip(a["sampler_logprobs"], b["sampler_logprobs"], strict=True)]
        assert max(gaps, default=0.0) < 1e-4, key
    ma, mb = step_metrics(first), step_metrics(second)
    for step in (2, 3):
        for key, value in ma[step].items():
            if key.startswith("sampler/"):
                continue  # the batching counters: what this test changes
            other = mb[step][key]
            if isinstance(value, float):
                assert math.isclose(value, other, rel_tol=1e-3, abs_tol=1e-5), (step, key, value, other)
            else:
                assert value == other, (step, key)


def _cli(tmp_path: Path, name: str, tasks: Path, *args: str) -> list[str]:
    sets = [x for o in overrides(tmp_path, name, tasks) for x in ("--set", o)]
    return [sys.executable, "-m", "mcprl_train", "train", "--profile", "cpu", *sets, *args]


def _latest_names(run: Path, step: int) -> bool:
    latest = run / "checkpoints" / "latest"
    return latest.is_file() and latest.read_text().startswith(f"step-{step:08d}")


def _step_logged(run: Path, step: int) -> bool:
    path = run / "trajectories.jsonl"
    return path.is_file() and f'"step":{step},' in path.read_text()


@pytest.mark.parametrize(
    ("kill_when", "tracking"),
    [("checkpoint_1", "off"), ("step_2_logged", "off"), ("step_2_logged", "wandb_offline_shared_service")],
)
def test_a_run_killed_with_sigkill_and_resumed_equals_the_uninterrupted_run(
    tmp_path: Path, kill_when: str, tracking: str
) -> None:
    """With tracking on, the runs log to wandb offline through one shared wandb-core service (``WANDB_SERVICE``,
    as a user's launcher or a parent process that used wandb exports it): the killed run's stream stays open
    there, and the resumed run must still be tracked and finish."""
    with contextlib.ExitStack() as stack:
        env = dict(os.environ)
        if tracking != "off":
            env = wandb_offline_env(stack.enter_context(shared_wandb_service()))
        _kill_and_resume(tmp_path, kill_when, env)
    run = tmp_path / "runs" / "killed"
    if tracking != "off":
        events = [json.loads(line)["event"] for line in (run / "training.log").open()]
        assert events.count("wandb_started") == 2, events  # the killed attempt and the resumed one
        assert "wandb_resume_refused" in events
    assert_identical_after(run, tmp_path / "runs" / "straight", 0)


def _kill_and_resume(tmp_path: Path, kill_when: str, env: dict[str, str]) -> None:
    tasks = demo_tasks(tmp_path / "tasks.json", 2)
    straight = subprocess.run(
        _cli(tmp_path, "straight", tasks), env=env, capture_output=True, text=True, timeout=900, check=False
    )
    assert straight.returncode == 0, straight.stderr[-2000:]
    run = tmp_path / "runs" / "killed"
    proc = subprocess.Popen(
        _cli(tmp_path, "killed", tasks), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    ready = (lambda: _latest_names(run, 1)) if kill_when == "checkpoint_1" else (lambda: _step_logged(run, 2))
    try:
        deadline = time.monotonic() + 900
        while not ready():
            assert proc.poll() is None, f"the run ended (rc {proc.returncode}) before the kill point"
            assert time.monotonic() < deadline, "the kill point never came"
            time.sleep(0.05)
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    resumed = subprocess.run(
        _cli(tmp_path, "killed", tasks, "--resume", str(run)),
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "Traceback" not in resumed.stderr
