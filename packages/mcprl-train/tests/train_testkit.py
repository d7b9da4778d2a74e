"""What several test modules of mcprl-train (and the GPU tests in the root tests/gpu/) share: synthetic episode
groups for the learner, the `plan` command run with no way to reach the hub, and the short runs on the demo's
servers (`demo_tasks`, `tiny_demo_run`)."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from collections.abc import Collection, Generator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

import mcprl_tasks
from mcprl_env import Episode, EpisodeGroup, Task
from mcprl_policy import Policy
from mcprl_train.typed_torch import tensor_list

PROMPT_TOKENS = 12


def synthetic_groups(
    policy: Policy, *, n_groups: int = 3, group_size: int = 4, seed: int = 0, success_every: int = 3
) -> list[EpisodeGroup]:
    """Groups of two-turn episodes of random ids whose sampler logprobs are the policy's own (ratios start at
    1); episode ``i`` of group ``g`` succeeds (reward 1) when ``(i + g) % success_every == 0``."""
    rng = random.Random(seed)
    vocab = len(policy.tokenizer)
    raw: list[tuple[list[int], list[int]]] = []
    for _ in range(n_groups * group_size):
        prompt = [rng.randrange(10, vocab) for _ in range(PROMPT_TOKENS)]
        turn = [rng.randrange(10, vocab) for _ in range(rng.randrange(4, 10))]
        tool = [rng.randrange(10, vocab) for _ in range(5)]
        turn2 = [rng.randrange(10, vocab) for _ in range(rng.randrange(3, 8))]
        mask = [0] * len(prompt) + [1] * len(turn) + [0] * len(tool) + [1] * len(turn2)
        raw.append((prompt + turn + tool + turn2, mask))
    with torch.no_grad():
        logprobs = policy.forward_packed([ids for ids, _ in raw], values=False).split("logprobs")
    groups: list[EpisodeGroup] = []
    for g in range(n_groups):
        episodes: list[Episode] = []
        for i in range(group_size):
            ids, mask = raw[g * group_size + i]
            lp = tensor_list(logprobs[g * group_size + i].float(), float)  # bf16 on a GPU
            success = (i + g) % success_every == 0
            episodes.append(
                Episode(
                    episode_id=f"t{g}/{i}",
                    task_id=f"t{g}",
                    group_id=f"t{g}",
                    token_ids=ids,
                    prompt_length=PROMPT_TOKENS,
                    loss_mask=mask,
                    sampler_logprobs=[x if m else 0.0 for x, m in zip(lp, mask, strict=True)],
                    messages=[],
                    reward=float(success),
                    reward_components={},
                    valid=True,
                    success=success,
                    stop_reason="answer",
                    error=None,
                    answer=None,
                    metrics={},
                )
            )
        task = Task(id=f"t{g}", prompt="What is the price of ACME?", answer="1")
        groups.append(EpisodeGroup(group_id=f"t{g}", task=task, episodes=episodes))
    return groups


def plan_cli(tmp_path: Path, *args: str, columns: int = 160) -> subprocess.CompletedProcess[str]:
    """``mcprl-train plan ARGS``: the real command with an empty cache, hub access left on and every request
    sent to a dead proxy, its console ``columns`` wide."""
    env = {
        **os.environ,
        "HF_HOME": str(tmp_path / "hf"),
        "HTTPS_PROXY": "http://127.0.0.1:9",
        "HTTP_PROXY": "http://127.0.0.1:9",
        "COLUMNS": str(columns),
    }
    env.pop("HF_HUB_OFFLINE", None)
    return subprocess.run(
        [sys.executable, "-m", "mcprl_train", "plan", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def demo_tasks(path: Path, per_family: int, *, families: Collection[str] | None = None) -> Path:
    """The first ``per_family`` train tasks of each demo family (finance, calculator and messaging servers), or
    of ``families`` only, written to the task file ``path``."""
    train, _ = mcprl_tasks.load_preset("demo")
    counts: dict[str, int] = {}
    tasks: list[dict[str, Any]] = []
    for task in mcprl_tasks.read_tasks(train):
        family = task["metadata"]["family"]
        if families is not None and family not in families:
            continue
        if counts.get(family, 0) < per_family:
            counts[family] = counts.get(family, 0) + 1
            tasks.append(task)
    path.write_text(json.dumps(tasks))
    return path


def tiny_demo_run(root: Path, name: str, tasks: Path, *, steps: int) -> list[str]:
    """The ``--set`` list of a short run of the tiny model on the demo's real stdio servers: run ``name`` under
    ``root``, ``steps`` GRPO steps of 4 tasks x 2 episodes on ``tasks`` (validated on them too), a 4-step warm
    start on 8 noisy demonstrations, 16 episodes at a time, turns of at most 48 tokens, 3 turns per episode, the
    system prompt's date pinned (a run resumed after midnight renders the same prompt), collected and then learned
    (no ``collection.overlap``: test_overlap.py runs the profile's overlap). A test appends what it changes (later
    settings win)."""
    return [
        f"run.name={name}",
        f"run.output_dir={root}",
        f"run.steps={steps}",
        "run.seed=5",
        f"tasks.train={tasks}",
        f"tasks.validation={tasks}",
        "sft.enabled=true",
        "sft.steps=4",
        "sft.demos=8",
        "sft.batch_size=4",
        "sft.teacher_noise=0.3",
        "grpo.group_size=2",
        "grpo.tasks_per_step=4",
        "env.max_new_tokens_per_turn=48",
        "env.max_turns_by_difficulty={easy: 3, medium: 3, hard: 3}",
        "env.template_date=2026-01-01",
        "collection.max_concurrent_episodes=16",
        "optim.warmup_steps=0",
        "tracking.progress=false",
        "collection.overlap=false",
    ]


CHECKPOINT_EVERY_STEP = (
    "run.checkpoint_every=1",
    "grpo.ppo_epochs=1",
    "grpo.minibatches=2",
    "grpo.filter_zero_std=false",
    "eval.every=0",
    "optim.lr=1e-3",
)
"""`tiny_demo_run`'s settings for the resume checks: a checkpoint after every step, one epoch of two
minibatches over every group (none filtered), no periodic evaluation."""


def wandb_offline_env(service: str | None = None) -> dict[str, str]:
    """This process's environment with wandb tracking offline (what a user without an account sets), quietly;
    with ``service``, the address of a shared wandb-core service (``WANDB_SERVICE``) every run connects to."""
    env = {**os.environ, "WANDB_MODE": "offline", "WANDB_SILENT": "true"}
    env.pop("WANDB_SERVICE", None)
    if service is not None:
        env["WANDB_SERVICE"] = service
    return env


@contextmanager
def shared_wandb_service() -> Generator[str]:
    """A detached wandb-core service, as a user starts one for worker processes (``wandb beta core start``):
    it outlives the runs that connect to it, so a run killed while connected leaves its stream behind there.
    Yields its ``WANDB_SERVICE`` address; stopped on exit."""
    wandb_cli = [sys.executable, "-c", "import sys; from wandb.cli.cli import cli; sys.exit(cli())"]
    env = {k: v for k, v in os.environ.items() if k != "WANDB_SERVICE"}
    started = subprocess.run(
        [*wandb_cli, "beta", "core", "start", "--idle-timeout", "15m"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    token = started.stdout.strip().splitlines()[-1]
    try:
        yield token
    finally:
        subprocess.run(
            [*wandb_cli, "beta", "core", "stop"],
            env={**env, "WANDB_SERVICE": token},
            capture_output=True,
            timeout=120,
            check=False,
        )
