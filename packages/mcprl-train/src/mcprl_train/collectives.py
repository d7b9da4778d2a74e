"""The few process-group collectives the data-parallel loop needs, each a no-op in a single process.

Every function here is collective: in a multi-process run every rank must call it, in the same order, or
the run deadlocks (the launcher's watchdog ends it). Without an initialised process group each returns what
one process would (`world_size` 1, the value itself), so callers need no special case.

Object collectives pickle their payload (episode groups, config trees, small metric dicts); on NCCL they go
through the current CUDA device, which `mcprl_train.parallel.deepspeed.init_distributed` sets to the local rank.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal, TypeVar, cast

import torch
import torch.distributed as dist

__all__ = [
    "all_gather_objects",
    "all_reduce_scalar",
    "all_reduce_tensor",
    "barrier",
    "broadcast_object",
    "is_distributed",
    "mean_metrics",
    "rank",
    "shard",
    "world_size",
]

T = TypeVar("T")
ReduceOp = Literal["sum", "max"]


def is_distributed() -> bool:
    """Whether a process group is initialised (i.e. this is one rank of a launched run)."""
    return dist.is_available() and dist.is_initialized()


def rank() -> int:
    return dist.get_rank() if is_distributed() else 0


def world_size() -> int:
    return dist.get_world_size() if is_distributed() else 1


def shard(items: Sequence[T], rank: int, world_size: int) -> list[T]:
    """Rank ``rank``'s share of ``items`` (round robin, whole items; one process gets all of them).

    Task groups are sharded whole: advantages are computed within a group, so they do not depend on which rank
    ran it.
    """
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} outside world of {world_size}")
    return list(items[rank::world_size])


def barrier() -> None:
    if is_distributed():
        dist.barrier()  # pyright: ignore[reportUnknownMemberType]  # torch leaves device_ids unannotated


def _device() -> torch.device:
    if is_distributed() and dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def all_reduce_tensor(value: torch.Tensor, op: ReduceOp = "sum") -> torch.Tensor:
    """A copy of ``value`` (any shape) reduced element-wise over the ranks (float64 on the wire)."""
    if not is_distributed():
        return value.clone()
    out = value.detach().to(device=_device(), dtype=torch.float64).clone()
    dist.all_reduce(out, op=dist.ReduceOp.SUM if op == "sum" else dist.ReduceOp.MAX)  # pyright: ignore[reportUnknownMemberType]  # torch leaves tensor/group unannotated
    return out.to(device=value.device, dtype=value.dtype)


def all_reduce_scalar(value: float, op: ReduceOp = "sum") -> float:
    """``value`` summed (or maximised) over the ranks."""
    return float(all_reduce_tensor(torch.tensor([float(value)], dtype=torch.float64), op)[0])


def broadcast_object(value: T, src: int = 0) -> T:
    """Rank ``src``'s ``value`` on every rank (others pass anything, e.g. None)."""
    if not is_distributed():
        return value
    box: list[T] = [value]
    dist.broadcast_object_list(box, src=src)
    return box[0]


def all_gather_objects(value: T) -> list[T]:
    """Every rank's ``value``, in rank order, on every rank."""
    if not is_distributed():
        return [value]
    out: list[T | None] = [None] * dist.get_world_size()
    dist.all_gather_object(out, value)  # pyright: ignore[reportUnknownMemberType]  # torch leaves its parameters unannotated
    return cast("list[T]", out)  # every slot filled by the gather


def mean_metrics(
    metrics: dict[str, float], *, maxed: Sequence[str] = (), summed: Sequence[str] = ()
) -> dict[str, float]:
    """Each key averaged over the ranks that report it (``maxed`` keys maximised, ``summed`` keys summed)."""
    per_rank = all_gather_objects(metrics)
    keys = sorted({k for m in per_rank for k in m})
    out: dict[str, float] = {}
    for key in keys:
        values = [float(m[key]) for m in per_rank if key in m]
        if key in maxed:
            out[key] = max(values)
        elif key in summed:
            out[key] = sum(values)
        else:
            out[key] = sum(values) / len(values)
    return out
