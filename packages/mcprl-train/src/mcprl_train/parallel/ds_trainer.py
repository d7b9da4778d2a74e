"""The training loop as one rank of a DeepSpeed run (``distributed.backend=deepspeed``).

`DistributedTrainer` is `mcprl_train.loop.trainer.Trainer` with the parts data parallelism changes:

- **Two copies of the policy per rank.** The trained one is partitioned by ZeRO-3 inside
  `mcprl_train.parallel.ds_learner.DeepSpeedLearner`; a full *replica* (eval mode, no gradients) is what the samplers
  generate from. After every update (and after a restore) the ranks gather the full parameters together and
  each loads them into its replica, so every rank samples from the weights just trained. The KL reference is
  a frozen copy of the replica (re-synced from it every ``run.ref_sync_every`` steps).
- **Collection is sharded by task group.** Every rank reads the same task stream (same seed), takes the
  step's ``tasks_per_step`` tasks and runs its share (`mcprl_train.parallel.deepspeed.shard_groups`) against its own
  MCP servers. The groups are all-gathered, so every rank sees the same step: the invalid-episode check, the
  zero-variance back-fill decision (the extra tasks are again taken by all and sharded) and the logged
  metrics are identical everywhere; each rank learns on its own groups only.
- **Evaluation is sharded the same way and needs no ZeRO collective**: it generates from the replicas,
  which are full copies, so no rank waits on another while generating. Each rank evaluates
  ``val_tasks[rank::world]``; the groups are gathered and `mcprl_train.loop.evaluation.evaluation_metrics` is computed
  on all of them. (Evaluating from the partitioned model, or on rank 0 alone with the partitioned model,
  would need every rank in every forward pass — the replica design avoids both.)
- **Rank 0 alone writes the run directory**: metrics, every rank's trajectories, the summary, plots (by the
  CLI), and the checkpoint. A checkpoint is collective: every rank writes its engine partition
  (``engine.save_checkpoint``) into a staging directory, then rank 0 writes the usual atomic checkpoint —
  the replica's full weights as ``policy/`` (loadable by ``mcprl-train eval`` and by a single-process run),
  the engine files as ``engine/``, learner/RNG/stream state — so ``latest`` still names only complete
  checkpoints. Resume: rank 0 picks the newest verified checkpoint and broadcasts it; every rank builds its
  policies from ``policy/`` and restores the engine (parameters and optimizer partitions) from ``engine/``.
  The run directory must be on a filesystem every rank sees (one node; or shared storage across nodes).
- Each rank writes ``ranks/rank-<r>.json`` at the end (world size, step, sha256 of its replica's weights):
  equal digests show every rank finished with the same weights.

Not under DeepSpeed: the SFT warm start (run it in one process first and start from its checkpoint), LoRA and
the vLLM sampler; the constructor says so.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

import structlog
import torch

from mcprl_train import build
from mcprl_train.errors import DistributedError
from mcprl_train.loop.evaluation import evaluate_tasks, evaluation_metrics
from mcprl_train.loop.trainer import Hook, Trainer
from mcprl_train.parallel import collectives
from mcprl_train.parallel.deepspeed import shard_groups
from mcprl_train.parallel.ds_learner import DeepSpeedLearner, load_full_state
from mcprl_train.run.progress import RunProgress
from mcprl_train.run.run_dir import RunDir

__all__ = ["DistributedTrainer", "replica_digest"]

logger = structlog.get_logger()

_STAGING = ".engine-staging-"


def replica_digest(policy: Any) -> str:
    """sha256 over a policy's model parameters in name order (equal across ranks iff the weights are)."""
    digest = hashlib.sha256()
    for name, param in sorted(policy.model.named_parameters()):
        digest.update(name.encode())
        digest.update(param.detach().float().cpu().numpy().tobytes())
    return digest.hexdigest()


def _move_contents(source: Path, target: Path) -> None:
    for item in sorted(source.iterdir()):
        os.replace(item, target / item.name)


class DistributedTrainer(Trainer):
    """One rank of a DeepSpeed training run (see the module docstring); every rank runs `run()`.

    Args:
        config: The resolved config (``model.device`` already pointing at this rank's device).
        run_dir: The run directory (created by rank 0, opened by the others).
        resume: Continue from the run directory's last complete checkpoint.
        hooks: As for `Trainer` (pass tracking hooks on rank 0 only).
    """

    def __init__(
        self, config: Any, run_dir: RunDir, *, resume: bool = False, hooks: tuple[Hook, ...] = ()
    ) -> None:
        self.rank = collectives.rank()
        self.world = collectives.world_size()
        super().__init__(
            config,
            run_dir,
            resume=resume,
            hooks=hooks,
            progress=None if self.rank == 0 else RunProgress(enabled=False),
        )
        if config.sft.enabled:
            raise DistributedError(
                "sft.enabled=true: the SFT warm start runs in one process; run it there first "
                "(--set distributed.backend=none --set distributed.zero_stage=0 --set run.steps=0) and start "
                "GRPO from its checkpoint with --set model.name=<run>/checkpoints/<step>/policy"
            )
        if config.sampler.backend != "hf":
            raise DistributedError(
                f"sampler.backend={config.sampler.backend}: under DeepSpeed each rank samples from its replica "
                "with the HF sampler (sampler.backend=hf)"
            )
        if config.grpo.tasks_per_step < self.world:
            raise DistributedError(
                f"grpo.tasks_per_step={config.grpo.tasks_per_step} is below the {self.world} ranks: every rank "
                "needs at least one task group per step"
            )
        self.replica: Any = None

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    # -- building and restoring ---------------------------------------------------------------------------

    def find_checkpoint(self) -> Any:
        """Rank 0 picks the newest verified checkpoint; every rank gets the same one."""
        loaded = super().find_checkpoint() if self.is_main else None
        return collectives.broadcast_object(loaded)

    def build_learning(self, loaded: Any) -> None:
        cfg = self.config
        source = str(loaded.subdir("policy")) if loaded else None
        # Rank 0 first: building or downloading a model fills a shared cache the others then read.
        if not self.is_main:
            collectives.barrier()
        self.policy = build.build_policy(cfg, source=source)
        self.replica = build.build_policy(cfg, source=source)
        if self.is_main:
            collectives.barrier()
        self.policy.train()
        self.replica.eval()
        for param in self.replica.model.parameters():
            param.requires_grad_(False)
        reference = build.build_reference(cfg, self.replica)
        self.learner = DeepSpeedLearner(
            policy=self.policy, config=cfg, total_steps=cfg.run.steps, seed=cfg.run.seed, reference=reference
        )
        self.sync_replica()
        # The reference starts from the same weights on every rank (a freshly initialised model may not).
        self.learner.sync_reference()
        self.sampler = build.build_sampler(cfg, self.replica, seed=self.rank_seed(0))
        self.eval_sampler = build.build_sampler(cfg, self.replica, greedy=cfg.eval.greedy, seed=cfg.run.seed)

    def rank_seed(self, step: int) -> int:
        """This rank's sampler seed at ``step`` (ranks sample differently; a resumed step samples alike)."""
        return (build.step_seed(self.config.run.seed, step) + 7_919 * self.rank) % (2**31 - 1)

    def sync_replica(self) -> None:
        """Gather the trained parameters (collective) into this rank's sampling replica."""
        assert isinstance(self.learner, DeepSpeedLearner)
        load_full_state(self.replica, self.learner.full_state_dict())

    def sync_sampler(self) -> None:
        self.sync_replica()
        super().sync_sampler()

    def restore(self, loaded: Any) -> None:
        assert isinstance(self.learner, DeepSpeedLearner)
        assert self.stream is not None
        if loaded is None:
            logger.warning("resume_without_checkpoint", run_dir=str(self.run_dir.path))
            if self.is_main:
                self.run_dir.rewind(-1)
            return
        self.learner.load_engine(loaded.path)
        self.state = self.restored_state(loaded)
        self.learner.load_state_dict(loaded.state("learner"))
        loaded.restore_rng()
        self.stream.position = self.state.position
        self.sync_sampler()
        if self.is_main:
            self.run_dir.rewind(self.state.step)
        self.restored_from = str(loaded.path)
        logger.info("resumed", checkpoint=loaded.path.name, stage=self.state.stage, step=self.state.step)

    # -- a step -------------------------------------------------------------------------------------------

    def step_sampler(self, step: int) -> None:
        self.sampler = build.build_sampler(self.config, self.replica, seed=self.rank_seed(step))

    async def collect_all(self, tasks: list[Any], step: int, round_: int) -> tuple[list[Any], list[Any]]:
        """Run this rank's share of ``tasks``; returns ``(this rank's groups, every rank's groups)``."""
        mine = await self.collect(shard_groups(tasks, self.rank, self.world), step, round_=round_)
        everyone = [g for part in collectives.all_gather_objects(mine) for g in part]
        return mine, everyone

    def update_metrics(self, learned: dict[str, float]) -> dict[str, float]:
        """This rank's update metrics averaged over the ranks (maxima and totals where those are meant)."""
        metrics = collectives.mean_metrics(
            learned,
            maxed=("ratio/max_abs_dev",),
            summed=("perf/train_tokens", "perf/micro_batches", "perf/filler_sequences"),
        )
        metrics["perf/world_size"] = float(self.world)
        return metrics

    async def evaluate(self, tag: str) -> dict[str, float]:
        """Sharded validation from the replicas (no ZeRO collective), metrics over every rank's groups."""
        if not self.val_tasks:
            return {}
        t0 = time.perf_counter()
        mine = shard_groups(self.val_tasks, self.rank, self.world)
        self.progress.work(f"validate ({tag})", total=len(mine))
        try:
            _, groups = await evaluate_tasks(
                self.env,
                mine,
                self.eval_sampler,
                max_concurrent_episodes=self.config.collection.max_concurrent_episodes,
                namespace=f"eval-{tag}-{self.state.sft_step}-{self.state.step}",
                on_group=lambda _group: self.progress.advance(),
            )
        finally:
            self.progress.work_done()
        parts = collectives.all_gather_objects((mine, groups))
        tasks = [t for part_tasks, _ in parts for t in part_tasks]
        every_group = [g for _, part_groups in parts for g in part_groups]
        metrics = evaluation_metrics(tasks, every_group, elapsed_s=time.perf_counter() - t0)
        metrics["time/elapsed_s"] = self.elapsed()
        self.log_metrics("eval", self.state.step, metrics, tag=tag)
        self.live_line_eval(tag, metrics)
        return metrics

    # -- records (rank 0) ---------------------------------------------------------------------------------

    def log_metrics(self, kind: str, step: int, metrics: dict[str, float], *, tag: str | None = None) -> None:
        """Every rank keeps the history (the values are the same everywhere); rank 0 writes it."""
        if self.is_main:
            super().log_metrics(kind, step, metrics, tag=tag)
        else:
            self.history.append({"kind": kind, "step": step, "tag": tag, **metrics})

    def write_trajectories(self, step: int, groups: list[Any]) -> None:
        if self.is_main:
            super().write_trajectories(step, groups)

    def live_line(self, step: int, m: dict[str, float]) -> None:
        if self.is_main:
            super().live_line(step, m)

    def live_line_eval(self, tag: str, m: dict[str, float]) -> None:
        if self.is_main:
            super().live_line_eval(tag, m)

    def checkpoint(self) -> None:
        """Every rank's engine partition, then rank 0's atomic checkpoint around them (collective)."""
        assert isinstance(self.learner, DeepSpeedLearner)
        self.state.elapsed_s = self.elapsed()
        manager = self.run_dir.checkpoints
        staging = manager.root / f"{_STAGING}{self.state.step:08d}"
        if self.is_main:
            manager.root.mkdir(parents=True, exist_ok=True)
            for stale in manager.root.glob(f"{_STAGING}*"):
                shutil.rmtree(stale, ignore_errors=True)
        collectives.barrier()
        engine_dir = self.learner.save_engine(staging)
        collectives.barrier()
        if self.is_main:
            manager.save(
                self.state.step,
                writers={
                    "policy": self.replica.save_pretrained,
                    "engine": lambda target: _move_contents(engine_dir, target),
                },
                state_dicts={"learner": self.learner.state_dict()},
                meta={
                    "state": self.state.to_dict(),
                    "world_size": self.world,
                    "zero_stage": self.config.distributed.zero_stage,
                },
            )
            shutil.rmtree(staging, ignore_errors=True)
        collectives.barrier()
        self.emit("after_checkpoint")

    def finish(self) -> dict[str, Any]:
        """Rank 0 writes ``summary.json``; every rank writes ``ranks/rank-<r>.json`` with its weights' digest."""
        summary = super().finish() if self.is_main else self.summary()
        ranks = self.run_dir.path / "ranks"
        ranks.mkdir(exist_ok=True)
        record = {
            "rank": self.rank,
            "world_size": self.world,
            "step": self.state.step,
            "digest": replica_digest(self.replica),
            "device": str(self.replica.device),
            "torch": torch.__version__,
        }
        (ranks / f"rank-{self.rank}.json").write_text(json.dumps(record, indent=2) + "\n")
        collectives.barrier()
        return summary
