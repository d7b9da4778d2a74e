"""DeepSpeed ZeRO for the ``a100x2`` profile (extra ``deepspeed``; the only module that imports it).

What is here:

- `deepspeed_config`: the DeepSpeed JSON generated from the profile — ZeRO stage, bf16, clipping, no
  DeepSpeed optimizer (a torch AdamW is handed to ``deepspeed.initialize``: DeepSpeed's own optimizers are
  JIT-compiled on first use, ~75 s on CPU) and caller-owned gradient accumulation
  (``managed_gradient_accumulation: false``: a step accumulates however many packed micro-batches it has).
- `init_distributed`: the process group (NCCL on CUDA, gloo on CPU) from the launcher's environment
  (``torchrun`` or ``deepspeed --num_gpus N``; ``--local_rank`` is accepted).
- `shard_groups`: each rank collects and learns on its share of a step's task groups; advantages are computed
  within each group, and a group never spans ranks, so they do not depend on which rank ran it.
- `DeepSpeedGRPO`: the policy wrapped in a DeepSpeed engine and one GRPO update (group advantages, clipped
  surrogate, token-mean) per call; every rank runs the same number of forward passes (ZeRO-3 gathers the
  parameters collectively in each one).
- `main`: the launcher entry ``python -m mcprl_train.parallel.deepspeed``, a bare ZeRO smoke test without a run
  directory: GRPO steps on fixed token batches (or, with ``--rollouts``, on each rank's share of task
  groups), reporting a hash of the full parameters per rank.

The full training loop under DeepSpeed — ``mcprl-train --profile a100x2``, with evaluation, checkpoints and
resume — is `mcprl_train.parallel.launch` (self-relaunch under torchrun), `mcprl_train.parallel.ds_trainer` (one rank of the
loop) and `mcprl_train.parallel.ds_learner` (the `Learner` math on the engine); they use the pieces above.

Multi-node: the same entries under a launcher on every node (``deepspeed --hostfile hosts --num_nodes 2
--num_gpus 8 --module mcprl_train --profile a100x2``; see the README).
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any, TypeVar

import attrs
import structlog
import torch
from torch import nn

from mcprl_train.config import Config
from mcprl_train.errors import DistributedError

__all__ = ["DeepSpeedGRPO", "TokenGroup", "deepspeed_config", "init_distributed", "main", "shard_groups"]

logger = structlog.get_logger()

T = TypeVar("T")
_HINT = "install the DeepSpeed extra: pip install 'mcprl-train[deepspeed]' (or uv sync --extra deepspeed)"


def require_deepspeed() -> ModuleType:
    """Import DeepSpeed or fail with the install command."""
    try:
        import deepspeed
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
    import deepspeed.ops

    compatible: dict[str, bool] = deepspeed.ops.__compatible_ops__
    compatible["deepspeed_shm_comm"] = False


def shard_groups(groups: Sequence[T], rank: int, world_size: int) -> list[T]:
    """This rank's share of a step's task groups (round robin; whole groups only)."""
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} outside world of {world_size}")
    return list(groups[rank::world_size])


@attrs.frozen(kw_only=True)
class TokenGroup:
    """A task group as token batches: G sequences with their action masks, sampler logprobs and rewards."""

    group_id: str
    token_ids: tuple[tuple[int, ...], ...]
    loss_mask: tuple[tuple[int, ...], ...]
    sampler_logprobs: tuple[tuple[float, ...], ...]
    rewards: tuple[float, ...]


class _PackedPolicy(nn.Module):
    """The policy's model (and value head) behind a forward that returns packed per-token logprobs."""

    def __init__(self, policy: Any) -> None:
        super().__init__()
        self.policy = policy
        self.model = policy.model

    def forward(self, sequences: list[list[int]], temperature: float) -> torch.Tensor:
        return self.policy.forward_packed(sequences, temperature=temperature).logprobs


class DeepSpeedGRPO:
    """The policy in a DeepSpeed engine and a GRPO update over this rank's groups.

    Args:
        policy: An `mcprl_policy.Policy` (its ``model`` is what DeepSpeed partitions).
        config: The run config (``distributed``, ``optim``, ``grpo``, ``sampling.temperature``).
    """

    def __init__(self, policy: Any, config: Config) -> None:
        deepspeed = require_deepspeed()
        self.config = config
        self.module = _PackedPolicy(policy)
        params = [p for p in self.module.model.parameters() if p.requires_grad]
        optim = config.optim
        optimizer = torch.optim.AdamW(
            params, lr=optim.lr, betas=optim.betas, eps=optim.eps, weight_decay=optim.weight_decay
        )
        self.engine, *_ = deepspeed.initialize(
            model=self.module, optimizer=optimizer, model_parameters=params, config=deepspeed_config(config)
        )

    def advantages(self, group: TokenGroup) -> torch.Tensor:
        """The group's advantages ``(G,)`` with the configured estimator (all of them within the group)."""
        from mcprl_grpo import group_advantages

        estimator = self.config.grpo.estimator
        if estimator == "gae":
            raise DistributedError(
                "grpo.estimator=gae needs the value head, which the DeepSpeed step does not train"
            )
        rewards = torch.tensor(group.rewards, dtype=torch.float32)
        gids = torch.zeros(len(rewards), dtype=torch.long)
        return group_advantages(rewards, gids, estimator=estimator, num_groups=1)

    def step(self, groups: Sequence[TokenGroup]) -> dict[str, float]:
        """One optimizer step on this rank's groups (one micro-batch per group, accumulated).

        Every rank must pass the same number of groups: ZeRO-3 gathers parameters collectively in each forward.
        """
        from mcprl_grpo import aggregate_loss, clipped_surrogate_loss

        grpo = self.config.grpo
        temperature = float(self.config.sampling.temperature)
        total_tokens = sum(sum(m) for g in groups for m in g.loss_mask)
        losses: list[float] = []
        self.engine.train()
        for group in groups:
            adv_per_seq = self.advantages(group)
            new = self.engine([list(s) for s in group.token_ids], temperature).float()
            mask = torch.tensor([b for m in group.loss_mask for b in m], dtype=torch.bool)
            for start in [0, *torch.tensor([len(s) for s in group.token_ids]).cumsum(0)[:-1].tolist()]:
                mask[start] = False  # the first token of each sequence has no prefix
            old = torch.tensor([x for lp in group.sampler_logprobs for x in lp], dtype=torch.float32)
            adv = torch.cat(
                [torch.full((len(s),), float(a)) for s, a in zip(group.token_ids, adv_per_seq, strict=True)]
            )
            token_loss = clipped_surrogate_loss(
                new,
                old,
                adv,
                mask,
                eps_low=grpo.clip_eps_low,
                eps_high=grpo.clip_eps_high,
                dual_clip=grpo.dual_clip,
            )
            loss = aggregate_loss(token_loss, mask, mode="token-mean", normalizer=max(1, total_tokens))
            self.engine.backward(loss)
            losses.append(float(loss.detach()))
        self.engine.step()
        norm = self.engine.get_global_grad_norm()
        return {
            "loss/policy": sum(losses),
            "optim/grad_norm": float(norm) if norm is not None else float("nan"),
        }

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """Every parameter gathered to full size on every rank (collective: call on all ranks)."""
        deepspeed = require_deepspeed()
        out: dict[str, torch.Tensor] = {}
        for name, param in self.module.model.named_parameters():
            with deepspeed.zero.GatheredParameters([param], modifier_rank=None):
                out[name] = param.detach().clone().float().cpu()
        return out


def parameter_digest(state: dict[str, torch.Tensor]) -> str:
    """sha256 over the parameters in name order (identical across ranks iff the parameters are)."""
    digest = hashlib.sha256()
    for name in sorted(state):
        digest.update(name.encode())
        digest.update(state[name].numpy().tobytes())
    return digest.hexdigest()


def fixed_token_groups(n_groups: int, group_size: int, *, vocab: int, seed: int = 0) -> list[TokenGroup]:
    """Deterministic token batches standing in for collected groups (same on every rank)."""
    gen = torch.Generator().manual_seed(seed)
    groups = []
    for g in range(n_groups):
        ids, masks, lps, rewards = [], [], [], []
        for i in range(group_size):
            length = 12 + int(torch.randint(0, 8, (1,), generator=gen))
            ids.append(tuple(int(t) for t in torch.randint(3, vocab, (length,), generator=gen)))
            masks.append(tuple([0] * 4 + [1] * (length - 4)))
            lps.append(tuple([0.0] * 4 + [-2.0] * (length - 4)))
            rewards.append(float((g + i) % 3 == 0))
        groups.append(
            TokenGroup(
                group_id=f"g{g}",
                token_ids=tuple(ids),
                loss_mask=tuple(masks),
                sampler_logprobs=tuple(lps),
                rewards=tuple(rewards),
            )
        )
    return groups


def token_group(group: Any) -> TokenGroup:
    """An `mcprl_env.EpisodeGroup` as token batches; invalid episodes keep their tokens but train on nothing."""
    episodes = list(group.episodes)
    return TokenGroup(
        group_id=str(group.group_id),
        token_ids=tuple(tuple(e.token_ids) for e in episodes),
        loss_mask=tuple(tuple(e.loss_mask) if e.valid else (0,) * len(e.token_ids) for e in episodes),
        sampler_logprobs=tuple(tuple(e.sampler_logprobs) for e in episodes),
        rewards=tuple(float(e.reward) if e.valid else 0.0 for e in episodes),
    )


def equalize(groups: list[TokenGroup], world_size: int, per_rank: int) -> list[TokenGroup]:
    """Pad a rank's groups to ``per_rank`` with reward-constant copies (zero advantage: no gradient).

    ZeRO-3 gathers parameters collectively in every forward, so every rank must run as many as the others.
    """
    if per_rank * world_size < len(groups):
        raise DistributedError(f"{len(groups)} groups exceed {per_rank} per rank")
    if not groups:
        raise DistributedError("a rank has no group to learn on: tasks_per_step must be >= the world size")
    pad = [
        attrs.evolve(
            groups[0], group_id=f"{groups[0].group_id}#pad{k}", rewards=(0.0,) * len(groups[0].rewards)
        )
        for k in range(per_rank - len(groups))
    ]
    return groups + pad


async def collect_share(
    config: Config, sampler: Any, tokenizer: Any, tasks: Sequence[Any], *, step: int
) -> list[TokenGroup]:
    """Run this rank's task groups against the configured MCP servers and return them as token groups."""
    from mcprl_env import Environment
    from mcprl_tools import ToolManager
    from mcprl_train import build
    from mcprl_train.loop.collection import collect_groups

    async with ToolManager(build.servers_config(config)) as manager:
        env = Environment(manager=manager, tokenizer=tokenizer, config=config.env)
        groups = await collect_groups(
            env,
            tasks,
            sampler,
            group_size=config.grpo.group_size,
            max_concurrent_episodes=config.collection.max_concurrent_episodes,
            max_retries=config.run.rollout_retries,
            namespace=f"step-{step}",
        )
    return [token_group(g) for g in groups]


class _RolloutSide:
    """A full replica of the policy for sampling (ZeRO-3 partitions the trained one) and the task stream.

    Every rank reads the same stream (same seed) and keeps its own share of each step's tasks.
    """

    def __init__(self, config: Config, *, rank: int, world: int, weights: dict[str, torch.Tensor]) -> None:
        from mcprl_train import build
        from mcprl_train.loop.task_stream import TaskStream

        self.config, self.rank, self.world = config, rank, world
        self.replica = build.build_policy(config)
        self.replica.eval()
        self.sync(weights)
        self.sampler = build.build_sampler(config, self.replica, seed=config.run.seed + rank)
        self.stream = TaskStream(
            build.load_task_source(config.tasks.train, name="train"), seed=config.run.seed
        )

    def sync(self, weights: dict[str, torch.Tensor]) -> None:
        """Load the trained weights into the sampling replica (before the first rollout and after each step)."""
        with torch.no_grad():
            for name, param in self.replica.model.named_parameters():
                param.copy_(weights[name].to(param.dtype))

    def collect(self, step: int) -> list[TokenGroup]:
        import anyio

        tasks = self.stream.take(self.config.grpo.tasks_per_step)
        mine = shard_groups(tasks, self.rank, self.world)
        collect = functools.partial(collect_share, step=step)
        groups = anyio.run(collect, self.config, self.sampler, self.replica.tokenizer, mine)
        per_rank = -(-len(tasks) // self.world)
        return equalize(groups, self.world, per_rank)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m mcprl_train.parallel.deepspeed``: ZeRO GRPO steps of a profile, on fixed token batches or rollouts.

    Prints one line per rank: ``rank=<r> digest=<sha256 of the full parameters> changed=<bool>`` (and with
    ``--out DIR`` writes it as ``DIR/rank-<r>.json``).
    """
    parser = argparse.ArgumentParser(prog="python -m mcprl_train.parallel.deepspeed")
    parser.add_argument("--profile", default="a100x2")
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--out", type=Path, default=None, help="also write rank-<r>.json into this directory")
    parser.add_argument(
        "--rollouts",
        action="store_true",
        help="collect each rank's share of task groups on the MCP servers (default: fixed token batches)",
    )
    parser.add_argument("--local_rank", "--local-rank", type=int, default=None)
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    config = Config.load(profile=args.profile, overrides=args.overrides)
    rank, world = init_distributed()
    torch.manual_seed(config.run.seed)
    from mcprl_train.build import build_policy

    # Rank 0 first: building or downloading the model populates a shared cache, and under torch.distributed
    # transformers writes weights only on rank 0 (`save_pretrained`), so other ranks must not build it.
    if rank != 0:
        torch.distributed.barrier()
    policy = build_policy(config)
    if rank == 0:
        torch.distributed.barrier()
    trainer = DeepSpeedGRPO(policy, config)
    full = trainer.full_state_dict()
    before = parameter_digest(full)
    fixed = fixed_token_groups(
        config.grpo.tasks_per_step,
        config.grpo.group_size,
        vocab=int(policy.model.config.vocab_size),
        seed=config.run.seed,
    )
    rollout = _RolloutSide(config, rank=rank, world=world, weights=full) if args.rollouts else None
    metrics: dict[str, float] = {}
    groups: list[TokenGroup] = []
    for step in range(1, args.steps + 1):
        groups = rollout.collect(step) if rollout is not None else shard_groups(fixed, rank, world)
        metrics = trainer.step(groups)
        if rollout is not None:
            rollout.sync(trainer.full_state_dict())  # collective: every rank gathers, every replica loads
        logger.info("distributed_step", rank=rank, step=step, groups=len(groups), **metrics)
    after = parameter_digest(trainer.full_state_dict())
    print(f"rank={rank} digest={after} changed={after != before}", flush=True)
    if args.out is not None:
        result = {
            "rank": rank,
            "world_size": world,
            "digest": after,
            "changed": after != before,
            "last_groups": [g.group_id for g in groups],
            **metrics,
        }
        (args.out / f"rank-{rank}.json").write_text(json.dumps(result))
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
