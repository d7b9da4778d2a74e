"""The sampling side of a run on this rank: samplers over the backend's sampling policy, in the environment.

`Rollouts` owns the rollout sampler and the greedy evaluation sampler. Each sampling request of a step carries
its own seed, derived from (``run.seed``, step, episode id, turn) (`collection_seed`, `mcprl_env.turn_seed`),
so a step samples alike in a resumed and an uninterrupted run whatever order tool latency gives the requests;
the rollout sampler is also rebuilt per step with a step-seeded generator for anything unseeded. Collection
and validation run as many episodes at once as the sampler can serve (`episode_concurrency`). The learning
side is `mcprl_train.loop.learner`; the trainer alternates the two.
"""

from __future__ import annotations

from collections.abc import Sequence

import structlog

from mcprl_env import Environment, Task, derive_seed
from mcprl_policy import Policy, PolicySampler
from mcprl_train import build, collectives
from mcprl_train.config import Config
from mcprl_train.loop.collection import Collection, collect_groups, episode_concurrency
from mcprl_train.loop.evaluation import evaluate_tasks
from mcprl_train.loop.snapshot import SamplingSnapshot
from mcprl_train.loop.state import sampler_seed
from mcprl_train.loop.update import UpdateBackend
from mcprl_train.run.progress import RunProgress

__all__ = ["Rollouts", "collection_seed"]

logger = structlog.get_logger()


def collection_seed(run_seed: int, step: int) -> int:
    """The sampling seed of GRPO step ``step``'s collection (every back-fill round and retry included).

    The same on every rank: a request's seed is ``turn_seed(collection_seed, episode_id, turn)``, and episode
    ids already tell ranks, rounds and retries apart.
    """
    return derive_seed(run_seed, "collect", step)


class Rollouts:
    """Samplers, environment and this rank's share of collection and validation.

    Args:
        config: The run config (``sampler``, ``sampling``, ``grpo``, ``collection``, ``eval``, ``run``).
        backend: The update backend; the samplers read its `sampling_policy`.
        env: The environment episodes run in.
        progress: Progress bars of collection and validation.
    """

    def __init__(
        self, config: Config, backend: UpdateBackend, env: Environment, *, progress: RunProgress
    ) -> None:
        self.config = config
        self.backend = backend
        self.env = env
        self.progress = progress
        self.rank = collectives.rank()
        self.world = collectives.world_size()
        self.concurrency = episode_concurrency(config.collection, config.sampler)
        if self.concurrency < config.collection.max_concurrent_episodes:
            logger.info(
                "episode_concurrency_capped",
                max_concurrent_episodes=config.collection.max_concurrent_episodes,
                sampler_max_batch_size=config.sampler.max_batch_size,
                episodes=self.concurrency,
            )
        self.snapshot: SamplingSnapshot | None = None
        if config.collection.overlap:
            self.snapshot = SamplingSnapshot(backend.sampling_policy)
        policy = self.sampling_policy
        rank_seed = config.run.seed + 7_919 * self.rank
        self.sampler: PolicySampler = build.build_sampler(config, policy, seed=rank_seed, backend=backend)
        # vLLM: the sampler's seed is its engine's, and the evaluation sampler shares the rollout's engine only
        # with the same seed. Building an engine in a process group is collective (vLLM all-reduces the free
        # memory), so every rank must build the same number: one each.
        eval_seed = rank_seed if config.sampler.backend == "vllm" else config.run.seed
        self.eval_sampler = build.build_sampler(
            config, policy, greedy=config.eval.greedy, seed=eval_seed, backend=backend
        )
        if config.sampler.backend == "vllm":
            from mcprl_policy.vllm_sampler import VLLMSampler

            assert isinstance(self.sampler, VLLMSampler)
            assert isinstance(self.eval_sampler, VLLMSampler)
            assert self.eval_sampler.llm is self.sampler.llm, (
                "a second engine on this rank: the ranks would hang"
            )

    @property
    def sampling_policy(self) -> Policy:
        """What the samplers generate from: the backend's sampling policy, or its snapshot under overlap."""
        return self.snapshot.policy if self.snapshot is not None else self.backend.sampling_policy

    def start_step(self, step: int) -> None:
        """The rollout sampler of GRPO step ``step`` (HF: a fresh, step-seeded generator)."""
        if self.config.sampler.backend == "hf":
            seed = sampler_seed(self.config.run.seed, step, self.rank)
            self.sampler = build.build_sampler(self.config, self.sampling_policy, seed=seed)

    def sync(self) -> None:
        """Publish the trained weights to the sampling policy (and its snapshot) and the samplers.

        The vLLM engine is pushed the weights unconditionally (``force``): ZeRO-3 updates a parameter's
        partition and gathers it into a new buffer behind ``param.data``, which leaves the autograd version
        counters that the engine's staleness check reads unchanged. Every call follows new weights (an update,
        a restore, a warm start), so nothing is pushed twice.
        """
        self.backend.publish()
        if self.snapshot is not None:
            self.snapshot.refresh()
        if self.config.sampler.backend == "vllm":
            from mcprl_policy.vllm_sampler import VLLMSampler

            assert isinstance(self.sampler, VLLMSampler), "sampler.backend=vllm builds a VLLMSampler"
            self.sampler.sync_weights(force=True)
        self.sampler.sync_weights()
        self.eval_sampler.sync_weights()

    def release_memory(self) -> None:
        """Before an update: with ``sampler.vllm_sleep``, put the vLLM engine (both samplers') to sleep.

        The next `sync` wakes it and pushes the updated weights.
        """
        if not self.config.sampler.vllm_sleep:
            return
        from mcprl_policy.vllm_sampler import VLLMSampler

        assert isinstance(self.sampler, VLLMSampler), "sampler.vllm_sleep is checked to mean the vLLM backend"
        self.sampler.sleep()

    async def collect(
        self, tasks: Sequence[Task], step: int, *, round_: int
    ) -> tuple[Collection, Collection]:
        """Run this rank's share of ``tasks``; returns ``(this rank's collection, every rank's)`` (collective).

        Every rank takes the same tasks; a task's group never spans ranks, so its advantages need no
        communication. In one process both are the same groups. The seed does not depend on the rank: an
        episode's id and turn pick its samples, whatever the number of ranks.
        """
        cfg = self.config
        label = f"collect step {step}" + (f" (back-fill {round_})" if round_ else "")
        self.progress.work(label, total=-(-len(tasks) // self.world))
        mine = await collect_groups(
            self.env,
            collectives.shard(tasks, self.rank, self.world),
            self.sampler,
            group_size=cfg.grpo.group_size,
            max_concurrent_episodes=self.concurrency,
            max_retries=cfg.run.rollout_retries,
            namespace=f"step-{step}" if round_ == 0 else f"step-{step}.{round_}",
            on_group=lambda _group: self.progress.advance(),
            seed=collection_seed(cfg.run.seed, step),
        )
        return mine, Collection.concat(collectives.all_gather_objects(mine))

    async def validate(self, tasks: Sequence[Task], *, label: str, namespace: str) -> dict[str, float]:
        """`val/*` metrics over every rank's share of ``tasks`` (collective), from the weights last `sync`ed.

        The trainer syncs after every update, restore and warm start, so a validation costs no extra gather of
        the weights (a collective under DeepSpeed).
        """
        self.backend.policy.eval()
        self.sampling_policy.eval()
        self.progress.work(f"validate ({label})", total=-(-len(tasks) // self.world))
        try:
            metrics, _ = await evaluate_tasks(
                self.env,
                tasks,
                self.eval_sampler,
                max_concurrent_episodes=self.concurrency,
                namespace=namespace,
                on_group=lambda _group: self.progress.advance(),
            )
        finally:
            self.backend.policy.train()
            self.sampling_policy.train()
            self.progress.work_done()
        return metrics
