"""``ranks/rank-<r>.json``: what each rank of a data-parallel run finished with.

Each rank writes its own record (rank, world size, step, device, torch version and a sha256 of the weights it
samples from); equal digests show that every rank finished with the same weights.
"""

from __future__ import annotations

import hashlib
import json

import torch

from mcprl_policy import Policy
from mcprl_train import collectives
from mcprl_train.run.run_dir import RunDir

__all__ = ["weights_digest", "write_rank_record"]


def weights_digest(model: torch.nn.Module) -> str:
    """sha256 over a model's parameters in name order (equal across ranks iff the weights are)."""
    digest = hashlib.sha256()
    for name, param in sorted(model.named_parameters()):
        digest.update(name.encode())
        digest.update(param.detach().float().cpu().numpy().tobytes())
    return digest.hexdigest()


def write_rank_record(run_dir: RunDir, policy: Policy, *, step: int) -> None:
    """This rank's ``ranks/rank-<r>.json``."""
    ranks = run_dir.path / "ranks"
    ranks.mkdir(exist_ok=True)
    record = {
        "rank": collectives.rank(),
        "world_size": collectives.world_size(),
        "step": step,
        "digest": weights_digest(policy.model),
        "device": str(policy.device),
        "torch": torch.__version__,
    }
    (ranks / f"rank-{collectives.rank()}.json").write_text(json.dumps(record, indent=2) + "\n")
