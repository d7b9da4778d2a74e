"""End to end: a shortened `uv run mcprl-train` (the cpu profile) learns tool use on real MCP servers.

Every package works together here: the embedded tiny model and tokenizer (mcprl-policy), the offline
finance/calculator/messaging servers (apps) behind the tool manager (mcprl-tools), token-exact episodes and
rewards (mcprl-env), the GRPO math (mcprl-grpo), and the warm start, loop, checkpoints and run directory
(mcprl-train). The full run and its bars are recorded in benchmarks/RESULTS.md ("## demo").
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from e2e_testkit import run_cli

# Above the run's own 1,200 s limit, so that a slow run fails with its stderr, not pytest-timeout's 900 s default.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1260)]

# Shortened demo: the cpu profile's full warm start (the model learns to copy prices only between SFT steps 300
# and 450), then 10 GRPO steps of 16 tasks, one greedy validation of 200 tasks before and after (fixed seed).
SHORT = [
    "--set", "run.seed=0",
    "--set", "sft.steps=450",
    "--set", "grpo.tasks_per_step=16",
    "--set", "run.steps=10",
    "--set", "run.checkpoint_every=5",
    "--set", "eval.every=0",
    "--set", "eval.n_tasks=200",
    "--set", "tracking.wandb=disabled",
]  # fmt: skip

# Validation reward after GRPO minus after the warm start (greedy). The warm start is bit-identical at a fixed
# thread count; the GRPO steps are not (which episodes share a decode batch depends on timing), so the bar leaves a
# wide margin under the recorded gains: the full profile gains +0.37 reward by GRPO step 10 (benchmarks/RESULTS.md,
# "## demo": 0.600 -> 0.971) and this shortened run on the smaller `tiny` model +0.219 ("## demo ablations and
# limits"). +0.08 is far under those and far over what a run that did not learn would show.
MIN_REWARD_GAIN = 0.08

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
    # `run_cli` runs one torch thread: the run reproduces the recorded one (CPU kernels are deterministic at a
    # fixed thread count).
    proc = run_cli("--set", f"run.output_dir={tmp_path}", "--run-name", "e2e", *SHORT, timeout=1200)
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
    assert steps == list(range(1, 11))
    episodes = (run / "trajectories.jsonl").read_text().splitlines()
    assert len(episodes) >= 10 * 16 * 8
