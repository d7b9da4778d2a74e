"""`mcprl-train --profile a100x2` end to end: one command, 2 gloo ranks, ZeRO-3, the tiny model, real MCP servers.

The a100x2 profile is overridden only where a CPU needs it (tiny model, fp32, no bf16 reduce in gloo, no
gradient checkpointing) and to keep the run small; everything else — the DeepSpeed backend, ZeRO stage 3,
the device count, the re-launch under torchrun — is the profile's own path.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import mcprl_tasks
from mcprl_train.run.run_dir import RunDir

pytestmark = pytest.mark.slow

RUN = "ds"


def _task_file(directory: Path) -> Path:
    """Two quote tasks, one with a much longer prompt: each step gives each rank one, of different lengths."""
    train, _ = mcprl_tasks.load_preset("demo")
    tasks = [t for t in mcprl_tasks.read_tasks(train) if t["metadata"]["family"] == "quote"][:2]
    tasks[1]["prompt"] += " Reply with the number only, exactly as precise as the quote tool gives it." * 2
    path = directory / "tasks.json"
    path.write_text(json.dumps(tasks))
    return path


def _overrides(tmp: Path, tasks: Path) -> list[str]:
    return [
        "model.name=tiny",
        "model.device=cpu",
        "model.dtype=float32",
        "model.gradient_checkpointing=false",
        "distributed.bf16=false",  # gloo has no bf16 all-reduce; the rest is the a100x2 path
        f"run.output_dir={tmp / 'runs'}",
        f"run.name={RUN}",
        "run.steps=2",
        "run.checkpoint_every=1",
        "run.seed=5",
        f"tasks.train={tasks}",
        f"tasks.validation={tasks}",
        "tools.offline=[finance]",
        "tools.allow_tools={finance: [get_quote]}",
        "grpo.group_size=2",
        "grpo.tasks_per_step=2",
        "grpo.filter_zero_std=false",
        "grpo.entropy_coef=0.01",  # a gradient even when a group's rewards are all equal
        "optim.lr=1e-3",
        "optim.warmup_steps=0",
        # Micro-batches span several logits chunks, more on the rank with the long prompt: the ranks must agree
        # on the output head's calls (ZeRO-3 gathers its weight collectively in each).
        "optim.logits_chunk_size=16",
        "optim.scheduler=constant",  # the profile's cosine ends at lr 0 on step 2: a resumed step 3 would not move
        "env.max_new_tokens_per_turn=12",
        "env.max_turns_by_difficulty={easy: 2, medium: 2, hard: 2}",
        "collection.max_concurrent_episodes=2",
        "eval.every=1",
        "eval.n_tasks=2",
        "tracking.progress=false",
        "tracking.wandb=disabled",
    ]


def _mcprl_train(*args: str) -> subprocess.CompletedProcess[str]:
    script = Path(sys.executable).with_name("mcprl-train")
    command = [str(script)] if script.is_file() else [sys.executable, "-m", "mcprl_train"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore", "WANDB_MODE": "disabled"}
    env = {k: v for k, v in env.items() if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK")}
    return subprocess.run(
        [*command, *args], capture_output=True, text=True, timeout=600, env=env, check=False
    )


def _ranks(run: Path) -> list[dict[str, Any]]:
    return [json.loads((run / "ranks" / f"rank-{r}.json").read_text()) for r in (0, 1)]


@pytest.fixture(scope="module")
def trained(
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[Path, list[str], subprocess.CompletedProcess[str]]:
    tmp = tmp_path_factory.mktemp("ds")
    overrides = _overrides(tmp, _task_file(tmp))
    proc = _mcprl_train("--profile", "a100x2", *[a for o in overrides for a in ("--set", o)])
    return tmp / "runs" / RUN, overrides, proc


def test_one_command_trains_the_a100x2_profile_on_two_ranks(
    trained: tuple[Path, list[str], subprocess.CompletedProcess[str]],
) -> None:
    run, _, proc = trained
    assert proc.returncode == 0, proc.stderr[-6000:]
    run_dir = RunDir.open(run)
    config = run_dir.load_config()
    assert (config.distributed.backend, config.distributed.zero_stage) == ("deepspeed", 3)
    ranks = _ranks(run)
    assert [r["world_size"] for r in ranks] == [2, 2]
    assert ranks[0]["digest"] == ranks[1]["digest"]
    assert [r["step"] for r in ranks] == [2, 2]
    records = run_dir.read_metrics().records
    grpo = [r for r in records if r["kind"] == "grpo"]
    assert [r["step"] for r in grpo] == [1, 2]
    for record in grpo:
        assert record["perf/world_size"] == 2.0
        assert record["adv/groups"] == 2.0  # both ranks' groups are in the logged metrics
        assert record["optim/steps"] >= 1.0
        for key in ("loss/policy", "loss/total", "loss/entropy", "optim/grad_norm", "rollout/reward_mean"):
            assert math.isfinite(record[key]), key
    # The rank with the short episode topped its micro-batches up to the other's logits-chunk count.
    assert sum(r["perf/filler_sequences"] for r in grpo) > 0
    evals = [r for r in records if r["kind"] == "eval"]
    assert [r["tag"] for r in evals] == ["init", "periodic", "final"]
    # Trajectories of every rank, each episode once: 2 steps x 2 groups x 2 episodes.
    keys = [(r["step"], r["episode_id"]) for r in run_dir.read_trajectories().records]
    assert len(keys) == len(set(keys)) == 8
    latest = run_dir.checkpoints.load_latest()
    assert latest is not None
    assert latest.step == 2
    assert latest.meta["world_size"] == 2
    assert (latest.path / "policy").is_dir()
    assert any((latest.path / "engine").iterdir())
    assert json.loads((run / "summary.json").read_text())["steps"] == 2


def test_a_two_rank_run_resumes_from_its_checkpoint(
    trained: tuple[Path, list[str], subprocess.CompletedProcess[str]],
) -> None:
    run, _, first = trained
    assert first.returncode == 0, first.stderr[-3000:]
    before = _ranks(run)[0]["digest"]
    proc = _mcprl_train("--resume", str(run), "--set", "run.steps=3", "--set", "eval.every=0")
    assert proc.returncode == 0, proc.stderr[-6000:]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["steps"] == 3
    assert "step-00000002" in summary["resumed_from"]
    ranks = _ranks(run)
    assert ranks[0]["digest"] == ranks[1]["digest"] != before
    grpo = [r for r in RunDir.open(run).read_metrics().records if r["kind"] == "grpo"]
    assert [r["step"] for r in grpo] == [1, 2, 3]
    assert math.isfinite(grpo[-1]["loss/total"])
