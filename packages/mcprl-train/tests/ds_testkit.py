"""What the 2-rank ``mcprl-train --profile a100x2`` tests share (test_ds_trainer.py, test_ds_reference.py,
test_ds_vllm.py): the CPU overrides of the profile, the task file, the run itself and the records it leaves.

Import-light on purpose: nothing from mcprl is imported at module level. ``mcprl_tasks`` brings llvmlite into
``sys.modules``, whose objects vLLM's kernel dispatcher (0.32) fails on when it scans every module as it builds
an in-process engine; the vLLM tests collected beside these would fail. The runs are subprocesses.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

__all__ = [
    "LEARNED",
    "a100x2",
    "cpu_overrides",
    "grpo_records",
    "learned",
    "quote_task_file",
    "rank_records",
    "trainer_overrides",
]

LEARNED = ("loss/", "ratio/", "clip/", "kl/", "adv/", "optim/", "value/", "rollout/reward")


def quote_task_file(directory: Path, count: int, *, long_second: bool = False) -> Path:
    """The demo set's first ``count`` quote tasks as ``directory/tasks.json``.

    ``long_second``: the second task's prompt made much longer, so each step gives the ranks episodes of
    different lengths.
    """
    import mcprl_tasks

    train, _ = mcprl_tasks.load_preset("demo")
    tasks = [t for t in mcprl_tasks.read_tasks(train) if t["metadata"]["family"] == "quote"][:count]
    if long_second:
        tasks[1]["prompt"] += (
            " Reply with the number only, exactly as precise as the quote tool gives it." * 2
        )
    path = directory / "tasks.json"
    path.write_text(json.dumps(tasks))
    return path


def cpu_overrides(tmp: Path, tasks: Path, run: str) -> list[str]:
    """The a100x2 profile on CPU (tiny model, fp32, no bf16 reduce in gloo), two short steps on the quote tool."""
    return [
        "model.name=tiny",
        "model.device=cpu",
        "model.dtype=float32",
        "model.gradient_checkpointing=false",
        "distributed.bf16=false",  # gloo has no bf16 all-reduce; the rest is the a100x2 path
        f"run.output_dir={tmp / 'runs'}",
        f"run.name={run}",
        "run.steps=2",
        "run.seed=5",
        f"tasks.train={tasks}",
        f"tasks.validation={tasks}",
        "tools.offline=[finance]",
        "tools.allow_tools={finance: [get_quote]}",
        "grpo.group_size=2",
        "grpo.filter_zero_std=false",
        "grpo.entropy_coef=0.01",  # a gradient even when a group's rewards are all equal
        "optim.lr=1e-3",
        "optim.warmup_steps=0",
        "optim.scheduler=constant",  # the profile's cosine ends at lr 0 on step 2: a resumed step 3 would not move
        "env.max_new_tokens_per_turn=12",
        "env.max_turns_by_difficulty={easy: 2, medium: 2, hard: 2}",
        "tracking.progress=false",
        "tracking.wandb=disabled",
    ]


def trainer_overrides(tmp: Path, run: str) -> list[str]:
    """`cpu_overrides` of test_ds_trainer.py's run (also test_ds_reference.py's): two quote tasks, one with a
    much longer prompt, so each step gives each rank one, of different lengths; checkpoints and evaluations every
    step; the KL reference following the policy every step (the profile's every 100 steps never come)."""
    tasks = quote_task_file(tmp, 2, long_second=True)
    return [
        *cpu_overrides(tmp, tasks, run),
        "run.checkpoint_every=1",
        "grpo.tasks_per_step=2",
        # Micro-batches span several logits chunks, more on the rank with the long prompt: the ranks must agree
        # on the output head's calls (ZeRO-3 gathers its weight collectively in each).
        "optim.logits_chunk_size=16",
        "reference.every=1",  # the reference's EMA reads the policy's full weights right after each update
        "reference.ema=0.5",
        # One episode at a time per rank: a decode batch's other rows move a row's logprobs in the last bits, and
        # which rows share a batch depends on tool latency; alone, two runs on the same weights sample alike.
        "collection.max_concurrent_episodes=1",
        "eval.every=1",
        "eval.n_tasks=2",
    ]


def a100x2(
    *args: str, env: dict[str, str] | None = None, timeout: float = 600
) -> subprocess.CompletedProcess[str]:
    """``mcprl-train ARGS`` in a subprocess (it re-launches itself under torchrun), one torch thread per rank."""
    script = Path(sys.executable).with_name("mcprl-train")
    command = [str(script)] if script.is_file() else [sys.executable, "-m", "mcprl_train"]
    environ = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore", "WANDB_MODE": "disabled"}
    environ |= env or {}
    environ = {k: v for k, v in environ.items() if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK")}
    return subprocess.run(
        [*command, *args], capture_output=True, text=True, timeout=timeout, env=environ, check=False
    )


def rank_records(run: Path) -> list[dict[str, Any]]:
    """Both ranks' ``ranks/rank-<r>.json`` (rank, world size, step, weights digest, ...)."""
    return [json.loads((run / "ranks" / f"rank-{r}.json").read_text()) for r in (0, 1)]


def grpo_records(run: Path) -> list[dict[str, Any]]:
    """The run's GRPO step records from ``metrics.jsonl``."""
    from mcprl_train.run.run_dir import RunDir

    return [r for r in RunDir.open(run).read_metrics().records if r["kind"] == "grpo"]


def learned(record: dict[str, Any]) -> dict[str, Any]:
    """What a GRPO step computed from the episodes' tokens and the weights (no timings, no sampler logprobs)."""
    return {k: v for k, v in record.items() if k.startswith(LEARNED)}
