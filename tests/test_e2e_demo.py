"""End to end: a shortened `uv run mcprl-train` (the cpu profile) learns tool use on real MCP servers.

Every package works together here: the embedded tiny model and tokenizer (mcprl-policy), the offline
finance/calculator/messaging servers (apps) behind the tool manager (mcprl-tools), token-exact episodes and
rewards (mcprl-env), the GRPO math (mcprl-grpo), and the warm start, loop, checkpoints and run directory
(mcprl-train). The full run and its bars are recorded in benchmarks/RESULTS.md ("## demo (issue 8)").
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

# Shortened demo: the cpu profile with fewer SFT and GRPO steps and a smaller validation set (fixed seed).
SHORT = [
    "--set", "run.seed=0",
    "--set", "sft.steps=150",
    "--set", "grpo.tasks_per_step=16",
    "--set", "run.steps=12",
    "--set", "run.checkpoint_every=6",
    "--set", "eval.every=0",
    "--set", "eval.n_tasks=320",
    "--set", "eval.greedy=false",
    "--set", "tracking.wandb=disabled",
]  # fmt: skip

# Validation reward after GRPO minus after the warm start, both sampled at the training temperature (after 150
# warm-start steps greedy decoding barely moves in 12 GRPO steps; the sampled policy, which GRPO trains, does).
# Recorded runs of this command with two GRPO settings near the profile's (Dr.GRPO, one update per batch), 160
# validation tasks: +0.084 (0.063 -> 0.147, std-normalised GRPO) and +0.055 (0.097 -> 0.152, Dr.GRPO with 4
# minibatches); the training reward rose step by step in both (benchmarks/RESULTS.md, "## demo (issue 8)").
# This test as committed (the profile's Dr.GRPO, 320 tasks) in a fresh-clone CI run: 0.075 -> 0.141 (+0.066), 429 s. Sampled evaluation is not bit-reproducible
# (which requests share a decode batch depends on timing), and the same warm-start weights scored 0.063 and 0.097:
# the standard error of a 160-task mean is ~0.012, so the test scores 320 tasks (~0.009) and asks for +0.025,
# about 2.5 standard errors of the difference (~0.012) below the smaller recorded gain.
MIN_REWARD_GAIN = 0.025

PROMISED = [
    "config.yaml",
    "metrics.jsonl",
    "trajectories.jsonl",
    "training.log",
    "summary.json",
    "checkpoints/latest",
    "plots/reward.png",
    "plots/success_rate.png",
    "plots/kl.png",
    "plots/losses.png",
]


def test_short_demo_improves_validation_reward_and_writes_every_promised_file(tmp_path: Path) -> None:
    # One torch thread: the run reproduces the recorded one (CPU kernels are deterministic at a fixed thread count).
    env = {**os.environ, "WANDB_MODE": "disabled", "WEAVE_DISABLED": "true", "OMP_NUM_THREADS": "1"}
    cmd = [
        sys.executable,
        "-m",
        "mcprl_train",
        "--set",
        f"run.output_dir={tmp_path}",
        "--run-name",
        "e2e",
        *SHORT,
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1200, env=env, check=False)
    assert proc.returncode == 0, proc.stderr[-4000:]
    run = tmp_path / "e2e"
    missing = [name for name in PROMISED if not (run / name).exists()]
    assert not missing, f"run directory lacks {missing}"
    assert (run / "checkpoints").is_dir()
    summary = json.loads((run / "summary.json").read_text())
    gain = summary["reward_final"] - summary["reward_warm_start"]
    assert gain >= MIN_REWARD_GAIN, summary
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert {r["kind"] for r in records} >= {"sft", "grpo", "eval"}
    steps = [r["step"] for r in records if r["kind"] == "grpo"]
    assert steps == list(range(1, 13))
    episodes = (run / "trajectories.jsonl").read_text().splitlines()
    assert len(episodes) >= 12 * 16 * 8
