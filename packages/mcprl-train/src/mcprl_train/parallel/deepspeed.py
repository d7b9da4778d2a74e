"""DeepSpeed for the ``a100x2`` profile (extra ``deepspeed``): the process group and the engine's config.

`deepspeed_config` hands no optimizer to DeepSpeed (a torch AdamW goes to ``deepspeed.initialize``: DeepSpeed's
own optimizers are JIT-compiled on first use, ~75 s on CPU) and keeps gradient accumulation with the caller
(``managed_gradient_accumulation: false``: a step accumulates however many packed micro-batches it has). The
engine itself is `ds_backend.DeepSpeedBackend`; the launch is `mcprl_train.parallel.launch`.
"""

from __future__ import annotations

import os
from types import ModuleType
from typing import Any

import torch

from mcprl_train.config import Config
from mcprl_train.errors import DistributedError

__all__ = ["deepspeed_config", "init_distributed", "require_deepspeed"]

_HINT = "install the DeepSpeed extra: pip install 'mcprl-train[deepspeed]' (or uv sync --extra deepspeed)"


def require_deepspeed() -> ModuleType:
    """Import DeepSpeed or fail with the install command."""
    try:
        import deepspeed  # pyright: ignore[reportMissingTypeStubs]  # DeepSpeed ships no type hints
    except ImportError as exc:
        raise DistributedError(f"distributed.backend=deepspeed needs DeepSpeed: {_HINT}") from exc
    return deepspeed


def deepspeed_config(config: Config) -> dict[str, Any]:
    """The DeepSpeed config of a profile: ZeRO stage, precision, clipping; optimizer and accumulation are ours."""
    ds = config.distributed
    zero: dict[str, Any] = {"stage": ds.zero_stage, "contiguous_gradients": True, "overlap_comm": False}
    if ds.zero_stage == 3:
        zero.update(
            {
                "stage3_gather_16bit_weights_on_model_save": True,
                "stage3_param_persistence_threshold": 0,
                "stage3_prefetch_bucket_size": 5e7,
                "stage3_max_live_parameters": 1e9,
            }
        )
    return {
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": 1,
        "managed_gradient_accumulation": False,
        "gradient_clipping": config.optim.max_grad_norm,
        "bf16": {"enabled": ds.bf16},
        "zero_optimization": zero,
        "zero_allow_untested_optimizer": True,
        "zero_force_ds_cpu_optimizer": False,
        "steps_per_print": 2**31 - 1,
        "wall_clock_breakdown": False,
    }


def init_distributed() -> tuple[int, int]:
    """Join the launcher's process group; returns ``(rank, world_size)``."""
    deepspeed = require_deepspeed()
    if "WORLD_SIZE" not in os.environ:
        raise DistributedError(
            "not started by a launcher (WORLD_SIZE unset): run under "
            "`torchrun --nproc-per-node N -m mcprl_train ...` or `deepspeed --num_gpus N --module mcprl_train ...` "
            "(plain `mcprl-train` with distributed.backend=deepspeed launches itself)"
        )
    if torch.cuda.is_available():
        # One device per process; object collectives on NCCL go through the current device.
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    elif os.environ.get("MCPRL_DS_SHM_COMM") != "1":
        _skip_cpu_shm_comm_op()
    deepspeed.init_distributed(dist_backend="nccl" if torch.cuda.is_available() else "gloo")
    return torch.distributed.get_rank(), torch.distributed.get_world_size()


def _skip_cpu_shm_comm_op() -> None:
    """Use plain gloo collectives on CPU instead of DeepSpeed's shared-memory comm op.

    DeepSpeed's CPU accelerator JIT-compiles that op with ninja on first use (minutes on 2 cores, and again
    whenever the compiler command line changes); it only speeds up intra-node CPU all-reduce, which CPU runs
    (tests, development) do not need. ``MCPRL_DS_SHM_COMM=1`` keeps it.
    """
    import deepspeed.ops  # pyright: ignore[reportMissingTypeStubs]

    compatible: dict[str, bool] = deepspeed.ops.__compatible_ops__
    compatible["deepspeed_shm_comm"] = False
