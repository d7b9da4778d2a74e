"""One command for a multi-process run: ``mcprl-train --profile a100x2`` re-launches itself under torchrun.

When the resolved config says ``distributed.backend=deepspeed`` and the process was not started by a
launcher (`launched`), the CLI runs `launch_command` and waits for it; each worker trains as one rank
(`train_rank`). Already-launched processes are left alone, so torchrun or the DeepSpeed launcher start a
multi-node run (the README's "DeepSpeed" has the commands).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import structlog

from mcprl_train.config import Config
from mcprl_train.errors import DistributedError

if TYPE_CHECKING:
    from mcprl_train.loop.trainer import BackendFactory
    from mcprl_train.run.run_dir import RunDir

RankTraining = Callable[[Config, "RunDir", bool, "BackendFactory"], dict[str, Any]]
"""``train(config, run_dir, resume, backend)``: one rank's training run; returns the summary."""

__all__ = ["check_devices", "launch_command", "launched", "relaunch", "strip_local_rank", "train_rank"]

logger = structlog.get_logger()

_LAUNCHER_ENV = ("WORLD_SIZE", "RANK", "LOCAL_RANK")


def launched(env: Mapping[str, str] | None = None) -> bool:
    """Whether this process is a worker started by torchrun / the DeepSpeed launcher (their env is set)."""
    environ = os.environ if env is None else env
    return all(key in environ for key in _LAUNCHER_ENV)


def strip_local_rank(argv: Sequence[str]) -> list[str]:
    """``argv`` without the ``--local_rank=N`` / ``--local-rank N`` the DeepSpeed launcher inserts."""
    out: list[str] = []
    args = iter(argv)
    for arg in args:
        if arg in ("--local_rank", "--local-rank"):
            next(args, None)  # its value
        elif not arg.startswith(("--local_rank=", "--local-rank=")):
            out.append(arg)
    return out


def launch_command(nproc: int, argv: Sequence[str]) -> list[str]:
    """The torchrun command that starts ``nproc`` workers of ``mcprl-train <argv>`` on this node."""
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes", "1"]
    return [*torchrun, "--nproc-per-node", str(nproc), "-m", "mcprl_train", *argv]


def check_devices(nproc: int, device: str) -> None:
    """A CUDA run needs one GPU per process.

    Raises:
        DistributedError: fewer visible GPUs than processes.
    """
    import torch

    if device == "cpu" or not (device.startswith("cuda") or device == "auto"):
        return
    have = torch.cuda.device_count()
    if device.startswith("cuda") and have < nproc:
        raise DistributedError(
            f"distributed.num_gpus={nproc} but {have} CUDA device(s) are visible; set "
            f"--set distributed.num_gpus={max(1, have)} (or check CUDA_VISIBLE_DEVICES)"
        )


def relaunch(nproc: int, argv: Sequence[str], *, device: str = "auto") -> int:
    """Run ``mcprl-train <argv>`` as ``nproc`` torchrun workers on this node; returns their exit code.

    Raises:
        DistributedError: not enough GPUs for ``nproc`` CUDA processes.
    """
    check_devices(nproc, device)
    command = launch_command(nproc, argv)
    logger.info("launching_workers", processes=nproc, command=" ".join(command))
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    code = subprocess.run(command, env=env, check=False).returncode
    return code if code >= 0 else 128 - code


def _local_device(config: Config) -> Config:
    """``model.device`` of this worker: ``cuda`` / ``auto`` become ``cuda:<LOCAL_RANK>`` when CUDA is there."""
    import torch

    if config.model.device in ("cuda", "auto") and torch.cuda.is_available():
        return config.replace([f"model.device=cuda:{int(os.environ.get('LOCAL_RANK', '0'))}"])
    return config


def train_rank(resolve_run: Callable[[], tuple[Config, RunDir, bool]], train: RankTraining) -> int:
    """What each launched worker runs: join the process group, share the run, train as one rank.

    Rank 0 resolves the run (``resolve_run``: creates the run directory or opens the one to resume) and
    broadcasts its path, config and resume flag — or the error, which every rank then raises. Each rank then
    runs ``train(config, run_dir, resume, backend)`` with the DeepSpeed backend (the same function a
    one-process run calls). Returns 0; prints the summary on rank 0.
    """
    import json

    import torch.distributed

    from mcprl_policy.vllm_engine import close_engines
    from mcprl_train import collectives
    from mcprl_train.parallel.deepspeed import init_distributed
    from mcprl_train.parallel.ds_backend import deepspeed_backend
    from mcprl_train.run.run_dir import RunDir

    rank, _world = init_distributed()
    shared: dict[str, Any] = {}
    failure: BaseException | None = None
    if rank == 0:
        try:
            config, run_dir, resume = resolve_run()
            shared = {"path": str(run_dir.path), "config": config.to_dict(), "resume": resume}
        except Exception as exc:  # every rank waits on this broadcast: whatever failed, all of them must stop
            failure, shared = exc, {"error": str(exc)}
    shared = collectives.broadcast_object(shared)
    if failure is not None:
        raise failure  # rank 0 reports the original error (the CLI prints it as one line)
    if "error" in shared:
        raise DistributedError(f"rank 0 could not set up the run: {shared['error']}")
    config = _local_device(Config.from_dict(shared["config"]))
    try:
        summary = train(
            config,
            RunDir.open(str(shared["path"])),
            bool(shared["resume"]),
            lambda source: deepspeed_backend(config, source=source),
        )
    finally:
        # vLLM engines (sampler.backend=vllm) joined the process group: their shutdown destroys it, and fails
        # after it is destroyed.
        close_engines()
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
    if rank == 0:
        print(json.dumps(summary, indent=2, sort_keys=True, default=str))
    return 0
