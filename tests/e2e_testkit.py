"""What the end-to-end tests share: the real `mcprl-train` command as a subprocess, the short run of a
stand-in model (warm start → one GRPO step → checkpoint → `eval` of the checkpoint) and its checks, and a pool
that starts a module's independent runs ahead of the tests that check them, in order."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Callable, Hashable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Protocol

import attrs
import pytest


class StandinModel(Protocol):
    """The `standin_model`/`llama_standin_model` fixtures: ``(release, template file) -> model directory``."""

    def __call__(self, release: str, template: str, /) -> Path: ...


class Launch(Protocol):
    """`run_cli`'s signature: runs ``mcprl-train ARGS`` to completion, its output captured."""

    def __call__(
        self, *args: str, cwd: Path | None = None, timeout: float = 900
    ) -> subprocess.CompletedProcess[str]: ...


def cli_env(**extra: str) -> dict[str, str]:
    """The environment of a `mcprl-train` subprocess: tracking offline, one torch thread (CPU kernels are
    deterministic at a fixed thread count)."""
    return {**os.environ, "WANDB_MODE": "disabled", "WEAVE_DISABLED": "true", "OMP_NUM_THREADS": "1", **extra}


def cli_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "mcprl_train", *args]


def run_cli(*args: str, cwd: Path | None = None, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    """``mcprl-train ARGS`` to completion, its output captured; the caller checks the exit code."""
    return subprocess.run(
        cli_command(*args),
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=cli_env(),
        check=False,
    )


def read_jsonl(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


SFT_STEPS = 1
TASKS_PER_STEP = 2
GROUP_SIZE = 2
EVAL_TASKS = 2

SHORT = [
    "--set", "run.seed=0",
    "--set", f"sft.steps={SFT_STEPS}",
    "--set", "sft.batch_size=1",
    "--set", "sft.demos=4",
    "--set", "sft.warmup_steps=0",
    "--set", "run.steps=1",
    "--set", "run.checkpoint_every=1",
    "--set", f"grpo.tasks_per_step={TASKS_PER_STEP}",
    "--set", f"grpo.group_size={GROUP_SIZE}",
    "--set", "grpo.filter_zero_std=false",
    "--set", "eval.every=0",
    "--set", f"eval.n_tasks={EVAL_TASKS}",
    "--set", "env.max_new_tokens_per_turn=16",
    "--set", "env.max_total_tokens=2048",
    "--set", "optim.lr=1e-4",
    "--set", "optim.logits_chunk_size=256",
    "--set", "tracking.wandb=disabled",
    "--set", "tracking.progress=false",
]  # fmt: skip
"""A stand-in's short run: a warm-start step, one GRPO step that updates (zero-variance groups kept: a random
model's rewards are all equal), a checkpoint after it, a validation of two tasks before and after. The model is
random, so the run proves the wiring, not learning."""

LORA = ["--set", "lora={r: 4, alpha: 8}"]


@attrs.frozen(kw_only=True)
class ShortRun:
    """A short run of a stand-in and the `mcprl-train eval` of its last checkpoint (None: training failed)."""

    model: Path
    run: Path
    train: subprocess.CompletedProcess[str]
    evaluated: subprocess.CompletedProcess[str] | None

    @property
    def checkpoint(self) -> Path:
        checkpoints = self.run / "checkpoints"
        return checkpoints / (checkpoints / "latest").read_text().split()[0]


def train_and_evaluate(
    model: Path,
    out: Path,
    extra: Sequence[str],
    launch: Launch = run_cli,
) -> ShortRun:
    """Runs `mcprl-train train` (SHORT + ``extra``) on ``model`` into ``out/run``, then `mcprl-train eval` on
    the checkpoint it names latest; checks nothing (`check_short_run` does, in the test)."""
    train = launch("train", "--set", f"model.name={model}", "--set", f"run.output_dir={out}", "--run-name", "run",
                   *SHORT, *extra)  # fmt: skip
    result = ShortRun(model=model, run=out / "run", train=train, evaluated=None)
    if train.returncode != 0:
        return result
    return attrs.evolve(result, evaluated=launch("eval", "--checkpoint", str(result.checkpoint)))


def check_short_run(result: ShortRun, *, vocab_limit: int) -> dict[str, object]:
    """Every stage ran, every episode is valid (no template drift, no infrastructure fault) with ids inside the
    vocabulary, and the checkpoint loads and evaluates; returns the `eval` summary."""
    assert result.train.returncode == 0, result.train.stderr[-4000:]
    records = read_jsonl(result.run / "metrics.jsonl")
    assert [r["sft_step"] for r in records if r["kind"] == "sft"] == list(range(1, SFT_STEPS + 1))
    grpo = [r for r in records if r["kind"] == "grpo"]
    assert [r["step"] for r in grpo] == [1]
    assert grpo[0]["rollout/valid_frac"] == 1.0, grpo[0]
    episodes = read_jsonl(result.run / "trajectories.jsonl")
    assert len(episodes) == TASKS_PER_STEP * GROUP_SIZE
    assert all(e["valid"] and e["error"] is None for e in episodes), [e["error"] for e in episodes]
    assert all(max(_ids(e["token_ids"])) < vocab_limit for e in episodes)
    assert result.evaluated is not None
    assert result.evaluated.returncode == 0, result.evaluated.stderr[-4000:]
    out = result.evaluated.stdout
    summary: dict[str, object] = json.loads(out[out.index("{") :])
    assert summary["step"] == 1
    assert summary["checkpoint"] == str(result.checkpoint)
    assert summary["tasks"] == EVAL_TASKS
    assert summary["val/valid_frac"] == 1.0, summary
    return summary


def _ids(value: object) -> list[int]:
    assert isinstance(value, list)
    return [int(x) for x in value]


def selected_params(request: pytest.FixtureRequest, name: str) -> list[str]:
    """The values of parameter ``name`` of the session's selected tests in the requesting module, in run order."""
    values: list[str] = []
    for item in request.session.items:
        callspec = getattr(item, "callspec", None)
        if item.path == request.path and callspec is not None and name in callspec.params:
            values.append(str(callspec.params[name]))
    return list(dict.fromkeys(values))


RUN_WORKERS = 1
"""Runs at once in a `RunPool`. Two at a time measured no faster on the shared 2-core machine (benchmarks/RESULTS.md,
"the stand-in end-to-end tests"); a machine with cores to spare may raise it."""


class RunPool:
    """Runs a module's independent subprocess jobs ``workers`` at a time in threads, each starting as soon as
    a worker is free, while the tests check their results in order; `close` kills what still runs.

    A job gets a `Launch` and must start its processes only through it.
    """

    def __init__(self, workers: int = RUN_WORKERS) -> None:
        self._executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="e2e-run")
        self._futures: dict[Hashable, Future[ShortRun]] = {}
        self._live: set[subprocess.Popen[str]] = set()
        self._lock = threading.Lock()
        self._closed = False

    def submit(self, key: Hashable, job: Callable[[Launch], ShortRun]) -> None:
        self._futures[key] = self._executor.submit(job, self._launch)

    def result(self, key: Hashable) -> ShortRun:
        return self._futures[key].result()

    def _launch(
        self, *args: str, cwd: Path | None = None, timeout: float = 900
    ) -> subprocess.CompletedProcess[str]:
        with self._lock:
            if self._closed:
                raise RuntimeError("the run pool was closed before this run started")
            proc = subprocess.Popen(
                cli_command(*args),
                cwd=cwd,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env=cli_env(),
            )
            self._live.add(proc)
        try:
            stdout, stderr = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            stdout, stderr = proc.communicate()
            stderr += f"\n[killed after {timeout} s]"
        finally:
            with self._lock:
                self._live.discard(proc)
        return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            for proc in self._live:
                proc.kill()
        self._executor.shutdown(wait=True, cancel_futures=True)
