"""`mcprl-train --profile a100x2` end to end: one command, 2 gloo ranks, ZeRO-3, the tiny model, real MCP servers.

The a100x2 profile is overridden only where a CPU needs it (tiny model, fp32, no bf16 reduce in gloo, no
gradient checkpointing), to keep the run small, and to make the KL reference follow the policy every step (the
profile's every 100 steps never come in a short run); everything else — the DeepSpeed backend, ZeRO stage 3,
sampling from the engine's gathered weights, the device count, the re-launch under torchrun — is the profile's
own path. The same run with a sampling replica per rank (``distributed.sampling=replica``) must give the same
episodes, metrics and weights: both sample from the same weights.
"""

from __future__ import annotations

import json
import math
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import torch
from ds_testkit import a100x2, learned, rank_records, trainer_overrides
from safetensors.torch import load_file  # pyright: ignore[reportUnknownVariableType]

from mcprl_train.run.run_dir import RunDir

pytestmark = pytest.mark.slow

RUN = "ds"
REPLICA_RUN = "ds-replica"


@pytest.fixture(scope="module")
def trained(
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[Path, list[str], subprocess.CompletedProcess[str]]:
    tmp = tmp_path_factory.mktemp("ds")
    overrides = trainer_overrides(tmp, RUN)
    proc = a100x2("--profile", "a100x2", *[a for o in overrides for a in ("--set", o)])
    return tmp / "runs" / RUN, overrides, proc


@pytest.fixture(scope="module")
def replica_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, subprocess.CompletedProcess[str]]:
    tmp = tmp_path_factory.mktemp("ds-replica")
    overrides = [*trainer_overrides(tmp, REPLICA_RUN), "distributed.sampling=replica"]
    proc = a100x2("--profile", "a100x2", *[a for o in overrides for a in ("--set", o)])
    return tmp / "runs" / REPLICA_RUN, proc


def test_one_command_trains_the_a100x2_profile_on_tworank_records(
    trained: tuple[Path, list[str], subprocess.CompletedProcess[str]],
) -> None:
    run, _, proc = trained
    assert proc.returncode == 0, proc.stderr[-6000:]
    run_dir = RunDir.open(run)
    config = run_dir.load_config()
    assert (config.distributed.backend, config.distributed.zero_stage) == ("deepspeed", 3)
    assert config.distributed.sampling == "engine"
    ranks = rank_records(run)
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
    assert latest.meta["sampling"] == "engine"
    assert (latest.path / "policy").is_dir()
    assert any((latest.path / "engine").iterdir())
    assert json.loads((run / "summary.json").read_text())["steps"] == 2


def test_a_two_rank_run_resumes_from_its_checkpoint(
    trained: tuple[Path, list[str], subprocess.CompletedProcess[str]],
) -> None:
    original, _, first = trained
    assert first.returncode == 0, first.stderr[-3000:]
    run = original.with_name(f"{RUN}-resumed")  # the original stays as it was for the replica comparison
    shutil.copytree(original, run)
    before = rank_records(run)[0]["digest"]
    proc = a100x2("--resume", str(run), "--set", "run.steps=3", "--set", "eval.every=0")
    assert proc.returncode == 0, proc.stderr[-6000:]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["steps"] == 3
    assert "step-00000002" in summary["resumed_from"]
    ranks = rank_records(run)
    assert ranks[0]["digest"] == ranks[1]["digest"] != before
    grpo = [r for r in RunDir.open(run).read_metrics().records if r["kind"] == "grpo"]
    assert [r["step"] for r in grpo] == [1, 2, 3]
    assert math.isfinite(grpo[-1]["loss/total"])


# The sampler's logprobs of the same tokens from the same weights agree to the last bit or two, not bit for bit:
# ZeRO-3's gathered parameters are views into one flat all-gather buffer, and a one-row matrix product (a decode
# step) on CPU rounds differently when its weight is not 16-byte aligned (measured: torch.nn.functional.linear
# of one row, fp32, differs by up to 1.5e-5 at offsets of 1-3 floats, never at multiples of 4). Only they, and the
# `mismatch/*` metrics computed from them, may differ; the learner recomputes π_old with the engine either way.
_ULP_NEAR_8 = 2**-20


def _episodes(run: Path) -> dict[tuple[int, str], dict[str, Any]]:
    return {(r["step"], r["episode_id"]): r for r in RunDir.open(run).read_trajectories().records}


def test_sampling_from_the_engine_gives_the_replicas_episodes_metrics_and_weights(
    trained: tuple[Path, list[str], subprocess.CompletedProcess[str]],
    replica_run: tuple[Path, subprocess.CompletedProcess[str]],
) -> None:
    engine, _, first = trained
    replica, proc = replica_run
    assert first.returncode == 0, first.stderr[-3000:]
    assert proc.returncode == 0, proc.stderr[-6000:]
    assert RunDir.open(replica).load_config().distributed.sampling == "replica"
    engine_episodes, replica_episodes = _episodes(engine), _episodes(replica)
    assert len(engine_episodes) >= 8
    assert engine_episodes.keys() == replica_episodes.keys()
    for key, ours in engine_episodes.items():
        theirs = replica_episodes[key]
        for field in ("token_ids", "loss_mask", "reward", "messages", "stop_reason"):
            assert ours[field] == theirs[field], (key, field)
        diffs = [
            abs(a - b) for a, b in zip(ours["sampler_logprobs"], theirs["sampler_logprobs"], strict=True)
        ]
        assert max(diffs) <= 2 * _ULP_NEAR_8, key
    engine_records = RunDir.open(engine).read_metrics().records
    replica_records = RunDir.open(replica).read_metrics().records
    engine_grpo = [learned(r) for r in engine_records if r["kind"] == "grpo"]
    replica_grpo = [learned(r) for r in replica_records if r["kind"] == "grpo"]
    assert len(engine_grpo) == 2
    assert all("loss/kl" in r for r in engine_grpo)
    assert engine_grpo == replica_grpo  # bit for bit: the same tokens, the same weights, the same reference
    engine_evals = [(r["tag"], r["val/success_rate"]) for r in engine_records if r["kind"] == "eval"]
    assert engine_evals == [(r["tag"], r["val/success_rate"]) for r in replica_records if r["kind"] == "eval"]
    saved = sorted(p.relative_to(engine) for p in engine.glob("checkpoints/step-*/policy/model.safetensors"))
    assert len(saved) >= 2
    assert saved == sorted(
        p.relative_to(replica) for p in replica.glob("checkpoints/step-*/policy/model.safetensors")
    )
    for name in saved:
        ours, theirs = load_file(engine / name), load_file(replica / name)
        assert ours.keys() == theirs.keys()
        assert all(v.numel() > 0 and torch.equal(v, theirs[k]) for k, v in ours.items())
    digests = {r["digest"] for r in [*rank_records(engine), *rank_records(replica)]}
    assert len(digests) == 1
