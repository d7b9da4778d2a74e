"""`mcprl-train --profile a100x2 --set sampler.backend=vllm`: each of 2 gloo ranks samples from its own vLLM engine.

Runs in the vllm-cpu environment (``scripts/test-vllm-cpu.sh``; vllm-cpu cannot be a uv dependency), where it is
the real thing: the one command re-launches itself under torchrun, each rank builds a vLLM engine with the
``external_launcher`` executor inside the DeepSpeed process group, collects its share of the task groups from
it, and after every update the engine is loaded with the rank's weights (ZeRO-3: gathered one bucket at a time,
`mcprl_train.parallel.gathered.ZeroParameters`). The CPU overrides of ``ds_testkit`` (tiny model, fp32, sizes),
plus ``grpo.old_logprobs=recompute``: the learner recomputes
each token's logprob with the engine's module, and ``mismatch/logprob_abs_diff_max`` (the largest difference from
the sampler's, maxed over the ranks) shows whether every rank's engine sampled from the weights of the step.
"""

from __future__ import annotations

import importlib.util
import math
import os
import shutil
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from ds_testkit import a100x2, cpu_overrides, grpo_records, quote_task_file, rank_records

if TYPE_CHECKING:
    from mcprl_train.run.run_dir import RunDir

# The runs are subprocesses: nothing here imports vllm or deepspeed, and mcprl_tasks / mcprl_train are imported
# only when a test runs (ds_testkit's docstring says why).
pytestmark = [
    pytest.mark.slow,
    pytest.mark.vllm,
    pytest.mark.skipif(
        importlib.util.find_spec("vllm") is None,
        reason="vllm is not installed (scripts/test-vllm-cpu.sh runs these)",
    ),
    pytest.mark.skipif(
        importlib.util.find_spec("deepspeed") is None,
        reason="deepspeed is not installed (the deepspeed extra)",
    ),
]

# vLLM's CPU kernels and the learner's torch forward of the same fp32 weights: their logprobs agree to ~1e-6
# (measured here: 9.5e-7). An engine left on the previous step's weights after one update at lr 1e-3 differs by
# about 1.3 (measured by skipping the push after the update: benchmarks/RESULTS.md, "vLLM under DeepSpeed").
_SAME_WEIGHTS = 1e-3


def _run_dir(path: Path) -> RunDir:
    from mcprl_train.run.run_dir import RunDir

    return RunDir.open(path)


def _overrides(tmp: Path, run: str, zero_stage: int) -> list[str]:
    return [
        *cpu_overrides(tmp, quote_task_file(tmp, 4), run),
        f"distributed.zero_stage={zero_stage}",
        "sampler.backend=vllm",
        "sampler.max_batch_size=8",
        "run.checkpoint_every=0",
        "grpo.tasks_per_step=4",  # two groups per rank
        "grpo.old_logprobs=recompute",  # the learner's logprobs beside the sampler's: mismatch/*
        "collection.max_concurrent_episodes=4",
        "eval.every=0",
        "eval.n_tasks=4",
    ]


_VLLM_ENV = {
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"),
}


def _mcprl_train(*args: str) -> subprocess.CompletedProcess[str]:
    return a100x2(*args, env=_VLLM_ENV, timeout=900)


def _train(tmp: Path, zero_stage: int) -> tuple[Path, subprocess.CompletedProcess[str]]:
    run = f"ds-vllm-z{zero_stage}"
    overrides = _overrides(tmp, run, zero_stage)
    proc = _mcprl_train("--profile", "a100x2", *[a for o in overrides for a in ("--set", o)])
    return tmp / "runs" / run, proc


@pytest.fixture(scope="module", params=[3, 2], ids=["zero3", "zero2"])
def trained(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> tuple[int, Path, subprocess.CompletedProcess[str]]:
    stage = int(request.param)
    run, proc = _train(tmp_path_factory.mktemp(f"ds-vllm-z{stage}"), stage)
    return stage, run, proc


def test_both_ranks_train_from_their_own_vllm_engine(
    trained: tuple[int, Path, subprocess.CompletedProcess[str]],
) -> None:
    stage, run, proc = trained
    assert proc.returncode == 0, proc.stderr[-8000:]
    config = _run_dir(run).load_config()
    assert (config.distributed.zero_stage, config.sampler.backend) == (stage, "vllm")
    ranks = rank_records(run)
    assert [r["world_size"] for r in ranks] == [2, 2]
    assert ranks[0]["digest"] == ranks[1]["digest"]
    grpo = grpo_records(run)
    assert [r["step"] for r in grpo] == [1, 2]
    for record in grpo:
        assert record["adv/groups"] == 4.0
        assert record["sampler/engine_steps"] > 0  # the vLLM sampler's counter (rank 0's)
        for key in ("loss/policy", "optim/grad_norm", "mismatch/logprob_abs_diff_max"):
            assert math.isfinite(record[key]), key


def test_every_ranks_engine_samples_the_weights_of_the_step(
    trained: tuple[int, Path, subprocess.CompletedProcess[str]],
) -> None:
    _, run, proc = trained
    assert proc.returncode == 0, proc.stderr[-8000:]
    grpo = grpo_records(run)
    # Step 2 sampled after the first update: its tokens' vLLM logprobs agree with the engine module's.
    diffs = [r["mismatch/logprob_abs_diff_max"] for r in grpo]
    assert max(diffs) < _SAME_WEIGHTS, diffs


def test_each_episode_is_collected_once_across_the_ranks(
    trained: tuple[int, Path, subprocess.CompletedProcess[str]],
) -> None:
    _, run, proc = trained
    assert proc.returncode == 0, proc.stderr[-8000:]
    records = _run_dir(run).read_trajectories().records
    keys = [(r["step"], r["episode_id"]) for r in records]
    # 2 steps x 4 groups x 2 episodes, each once; every step holds every task's group.
    assert len(keys) == len(set(keys)) == 16
    for step in (1, 2):
        tasks = sorted(r["task_id"] for r in records if r["step"] == step)
        assert (len(set(tasks)), len(tasks)) == (4, 8), tasks


def test_a_resumed_run_samples_every_rank_from_the_restored_weights(
    trained: tuple[int, Path, subprocess.CompletedProcess[str]],
) -> None:
    _, run, first = trained
    assert first.returncode == 0, first.stderr[-8000:]
    resumed = run.with_name(f"{run.name}-resumed")
    shutil.copytree(run, resumed)
    proc = _mcprl_train("--resume", str(resumed), "--set", "run.steps=3")
    assert proc.returncode == 0, proc.stderr[-8000:]
    grpo = grpo_records(resumed)
    assert [r["step"] for r in grpo] == [1, 2, 3]
    assert grpo[-1]["mismatch/logprob_abs_diff_max"] < _SAME_WEIGHTS, grpo[-1]
