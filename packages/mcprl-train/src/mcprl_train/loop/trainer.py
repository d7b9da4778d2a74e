"""The training loop: warm start (SFT) → GRPO steps (collect → learn → sync) with evaluation and checkpoints.

One `Trainer` serves one process and every rank of a data-parallel run alike: rank and world size come from
`mcprl_train.collectives` (rank 0 of 1 without a process group); every rank takes the same tasks, collects its
share and all-gathers the groups, so the checks, the back-fill decision and the logged metrics agree; each rank
learns on its own groups through the learner's `UpdateBackend`. Rank 0 alone writes to the sinks; a
checkpoint is collective, and a resumed run takes the step an uninterrupted run would have taken next.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Sequence
from typing import Any

import anyio
import structlog

from mcprl_env import Environment, Task
from mcprl_env.judge import judge_metrics
from mcprl_policy import Policy, PolicySampler
from mcprl_train import build, collectives
from mcprl_train.build import TaskData
from mcprl_train.config import Config
from mcprl_train.loop.collection import tool_step_metrics
from mcprl_train.loop.learner import Learner
from mcprl_train.loop.overlap import CollectedStep, collect_step, learn_step, learn_while_collecting
from mcprl_train.loop.rollouts import Rollouts
from mcprl_train.loop.state import TrainState, frozen_heap, seed_everything
from mcprl_train.loop.summary import run_summary
from mcprl_train.loop.task_stream import TaskStream
from mcprl_train.loop.update import UpdateBackend
from mcprl_train.loop.warm_start import SFTStage, teacher_success
from mcprl_train.run.checkpoint import Checkpoint
from mcprl_train.run.heap import trim_heap
from mcprl_train.run.phases import PHASES_FILE, PhaseLog
from mcprl_train.run.progress import RunProgress
from mcprl_train.run.ranks import write_rank_record
from mcprl_train.run.run_dir import RunDir
from mcprl_train.run.sinks import ConsoleSink, MetricKind, MetricsSink, SinkGroup

logger = structlog.get_logger()

Hook = Callable[[str, "Trainer"], None]
BackendFactory = Callable[[str | None], UpdateBackend]
"""Builds the trained policy where its update runs, from a saved policy directory (None: ``model.name``)."""


class Trainer:
    """One training run in a run directory; in a data-parallel run, this process's rank of it.

    Args:
        config: The resolved `mcprl_train.config.Config`.
        run_dir: The `mcprl_train.run.run_dir.RunDir` (created by the caller with `RunDir.create` / `RunDir.open`).
        resume: Continue from the run directory's last complete checkpoint.
        backend: Builds the trained policy and its update backend (`BackendFactory`); None: this process
            (`mcprl_train.build.torch_backend`).
        tasks: The task data already read by the caller (`mcprl_train.build.load_tasks`); None reads it.
        sinks: Where metrics, episodes and the summary go besides the run directory and the console (the
            tracker). Rank 0 alone writes to any sink.
        hooks: Called as `hook(event, trainer)` at `before_rollout`, `after_rollout`, `after_update`,
            `after_step`, `after_checkpoint` (tests use them to inspect or interrupt a run).
        progress: Progress bars; None: from `tracking.progress` (only on a terminal, only on rank 0).
    """

    def __init__(
        self,
        config: Config,
        run_dir: RunDir,
        *,
        resume: bool = False,
        backend: BackendFactory | None = None,
        tasks: TaskData | None = None,
        sinks: Sequence[MetricsSink] = (),
        hooks: tuple[Hook, ...] = (),
        progress: RunProgress | None = None,
    ) -> None:
        self.config = config
        self.run_dir = run_dir
        self.resume = resume
        self.rank = collectives.rank()
        self.world = collectives.world_size()
        self.is_writer = self.rank == 0  # rank 0 alone writes the run directory
        self.tasks = tasks
        self.backend_factory: BackendFactory = backend or (
            lambda source: build.torch_backend(config, source=source)
        )
        self.extra_sinks = tuple(sinks)
        self.sinks = SinkGroup([])  # the run's sinks are built once the warm start's length is known
        self.hooks = hooks
        self.progress = progress or RunProgress(enabled=config.tracking.progress and self.is_writer)
        self.state = TrainState(stage="sft" if config.sft.enabled else "grpo")
        self.backend: UpdateBackend | None = None
        self.rollouts: Rollouts | None = None
        self.learner: Learner | None = None
        self.sft: SFTStage | None = None
        self.stream: TaskStream | None = None
        self.val_tasks: list[Task] = []
        self.history: list[dict[str, Any]] = []
        self.last_step_tasks: list[str] = []
        self.pending: CollectedStep | None = None  # the next step's collection, run beside this step's update
        self.synced_step = 0  # the GRPO step whose update the samplers' weights came from
        self.restored_from: str | None = None
        self.clock = time.perf_counter()
        self.teacher_success: float | None = None
        self.phases = PhaseLog(run_dir.path / PHASES_FILE if self.is_writer else None)

    @property
    def sampler(self) -> PolicySampler:
        """This step's rollout sampler."""
        assert self.rollouts is not None
        return self.rollouts.sampler

    @property
    def policy(self) -> Policy:
        """The trained policy."""
        assert self.backend is not None
        return self.backend.policy

    def emit(self, event: str) -> None:
        for hook in self.hooks:
            hook(event, self)

    def run(self) -> dict[str, Any]:
        """Run every remaining stage; returns the summary (also written to `summary.json`)."""
        return anyio.run(self.arun)

    async def arun(self) -> dict[str, Any]:
        from mcprl_train.cassettes import tool_manager

        cfg = self.config
        self.phases.announce("startup", self.state)
        seed_everything(cfg.run.seed)
        if (warning := build.tiny_profile_warning(cfg)) is not None:
            logger.warning("profile_made_for_the_tiny_model", detail=warning)
        train_set, self.val_tasks = self.tasks or build.load_tasks(cfg)  # before anything heavy
        demos = build.load_demos(cfg) if cfg.sft.enabled else []  # a bad demonstrations file fails here too
        self.stream = TaskStream(train_set, seed=cfg.run.seed)
        latest = self.run_dir.checkpoints.load_latest() if self.resume and self.is_writer else None
        loaded = collectives.broadcast_object(latest) if self.resume else None
        tools = tool_manager(cfg, self.run_dir.path, world_size=self.world)  # a bad cassette fails first
        self.build_learning(loaded)
        async with tools as manager:
            env = Environment(manager=manager, tokenizer=self.policy.tokenizer, config=cfg.env)
            assert self.backend is not None
            self.rollouts = Rollouts(cfg, self.backend, env, progress=self.progress)
            if cfg.sft.enabled:
                self.sft = SFTStage.from_demonstrations(self.policy, demos, train_set, env, cfg)
                self.teacher_success = teacher_success(demos)
            if self.is_writer:
                console = ConsoleSink(cfg, sft_steps=self.sft.total_steps if self.sft else None)
                self.sinks = SinkGroup([self.run_dir, console, *self.extra_sinks])
            if self.resume:
                self.restore(loaded)
            with self.progress, frozen_heap():
                return await self.stages()

    def build_learning(self, loaded: Checkpoint | None) -> None:
        """Policy (restored weights when `loaded`) and its update backend, samplers, reference and learner."""
        cfg = self.config
        self.backend = self.backend_factory(str(loaded.subdir("policy")) if loaded else None)
        self.policy.train()
        self.learner = Learner(
            policy=self.policy,
            config=cfg,
            total_steps=cfg.run.steps,
            seed=cfg.run.seed,
            reference=build.build_reference(cfg, self.backend),
            backend=self.backend,
        )
        self.backend.publish()
        # The reference starts from the same weights on every rank (a freshly initialised model may not).
        self.learner.sync_reference()

    # -- stages ------------------------------------------------------------------------------------------

    async def stages(self) -> dict[str, Any]:
        cfg = self.config
        self.clock = time.perf_counter() - self.state.elapsed_s
        if self.state.stage == "sft":
            # No evaluation of the untrained model here: it cannot call a tool; "warm_start" is the baseline.
            await self.warm_start()
            trim_heap()  # the warm start's activations, before the evaluation decodes in another thread
            self.sync_sampler()  # the GRPO rollouts must start from the warm-started weights
            assert self.learner is not None
            self.learner.sync_reference()  # and the KL reference is the warm-started policy, not its init
            await self.evaluate("warm_start")
            self.state.stage = "grpo"
            self.checkpoint()
        elif self.state.stage == "grpo" and self.state.step == 0 and self.restored_from is None:
            await self.evaluate("init")
        if self.state.stage == "grpo":
            self.progress.stage("GRPO", total=cfg.run.steps, completed=self.state.step)
        while self.state.stage == "grpo" and self.state.step < cfg.run.steps:
            await self.grpo_step()
            self.progress.step_done()
            if cfg.eval.every and self.state.step % cfg.eval.every == 0 and self.state.step < cfg.run.steps:
                await self.evaluate("periodic")
            if cfg.run.checkpoint_every and self.state.step % cfg.run.checkpoint_every == 0:
                self.checkpoint()
        if self.state.stage == "grpo":
            if cfg.run.steps > 0 or not cfg.sft.enabled:
                await self.evaluate("final")
            self.state.stage = "done"
            self.checkpoint()
        return self.finish()

    async def warm_start(self) -> None:
        """Supervised steps on the demonstrations until `sft.steps` (or `sft.epochs`, or `sft.max_time_s`)."""
        assert self.sft is not None
        cfg = self.config.sft
        total = self.sft.total_steps
        self.progress.stage("warm start (SFT)", total=total, completed=self.state.sft_step)
        while self.state.sft_step < total:
            if cfg.max_time_s is not None and self.elapsed() >= cfg.max_time_s:
                logger.info(
                    "sft_time_budget_reached", sft_step=self.state.sft_step, max_time_s=cfg.max_time_s
                )
                break
            self.phases.announce("warm_start", self.state)
            metrics = self.sft.train_step()
            self.state.sft_step = self.sft.step
            metrics["time/elapsed_s"] = self.elapsed()
            if self.teacher_success is not None:
                metrics["sft/teacher_success"] = self.teacher_success
            self.log_metrics("sft", self.state.step, metrics)
            self.progress.step_done()
            if cfg.eval_every and self.state.sft_step % cfg.eval_every == 0 and self.state.sft_step < total:
                self.sync_sampler()  # between optimizer steps: the samplers have not seen these weights
                await self.evaluate("sft")
            every = cfg.checkpoint_every
            if every and self.state.sft_step % every == 0 and self.state.sft_step < total:
                self.sync_sampler()  # a checkpoint saves the sampling policy's weights
                self.checkpoint()

    async def grpo_step(self) -> dict[str, float]:
        """Learn on step k's groups (collected on their own, or beside step k-1's update), sync the samplers.

        With ``collection.overlap`` step k+1 is collected while step k's update runs (`mcprl_train.loop.overlap`),
        except before a scheduled checkpoint and after the last step: a checkpoint then holds nothing in flight.
        """
        learner = self.learner
        assert learner is not None
        assert self.stream is not None
        assert self.rollouts is not None
        cfg = self.config
        step = self.state.step + 1
        t0 = time.perf_counter()
        # Both collections sample from the weights the samplers hold now: the update's sync comes after them.
        collect = functools.partial(
            collect_step,
            cfg,
            stream=self.stream,
            rollouts=self.rollouts,
            learner=learner,
            sampled_after=self.synced_step,
        )
        ready = self.pending
        self.pending = None
        if ready is None:
            self.emit("before_rollout")
            self.phases.announce("collection", self.state, step=step)
            ready = await collect(step)
            self.emit("after_rollout")
        self.last_step_tasks = ready.task_ids
        self.state.position = ready.position
        every = cfg.run.checkpoint_every
        prefetch = cfg.collection.overlap and step < cfg.run.steps and not (every and step % every == 0)
        self.progress.work_done()
        self.rollouts.release_memory()
        trim_heap()  # what the decode thread freed, before the update allocates in the main thread
        self.phases.announce("update_and_collection" if prefetch else "update", self.state, step=step)
        learned, self.pending = await learn_while_collecting(
            lambda: learn_step(learner, ready.samples, step),
            (lambda: collect(step + 1)) if prefetch else None,
        )
        self.sync_sampler()
        trim_heap()  # the update's activations, before the next collection
        self.synced_step = step
        self.emit("after_update")
        self.state.step = step
        elapsed = time.perf_counter() - t0
        n_tokens = sum(len(e.token_ids) for g in ready.collected.groups for e in g.episodes)
        metrics = ready.metrics | learned | {"perf/step_s": elapsed, "time/elapsed_s": self.elapsed()}
        metrics["perf/tokens_per_s"] = n_tokens / max(1e-9, elapsed)
        self.phases.announce("records", self.state, step=step)
        self.log_metrics("grpo", step, metrics)
        self.sinks.write_episodes(step, ready.collected.trajectory_records())
        self.emit("after_step")
        return metrics

    def sync_sampler(self) -> None:
        """Publish the trained weights to the sampling policy and the samplers."""
        assert self.rollouts is not None
        self.rollouts.sync()

    async def evaluate(self, tag: str) -> dict[str, float]:
        """Validation metrics (`val/*`) over every rank's share of the validation tasks, logged with `tag`."""
        if not self.val_tasks:
            return {}
        assert self.rollouts is not None
        self.phases.announce("evaluation", self.state, tag=tag)
        namespace = f"eval-{tag}-{self.state.sft_step}-{self.state.step}"
        metrics = await self.rollouts.validate(self.val_tasks, label=tag, namespace=namespace)
        # Its own tool events: left in the counters they would join the next step's, which a resume changes.
        metrics.update({f"val/{k}": v for k, v in tool_step_metrics(self.rollouts.env).items()})
        metrics["time/elapsed_s"] = self.elapsed()
        self.log_metrics("eval", self.state.step, metrics, tag=tag)
        trim_heap()
        return metrics

    def elapsed(self) -> float:
        return time.perf_counter() - self.clock

    # -- records -----------------------------------------------------------------------------------------

    def log_metrics(
        self, kind: MetricKind, step: int, metrics: dict[str, float], *, tag: str | None = None
    ) -> None:
        """One `metrics.jsonl` record; SFT records carry GRPO step 0 (so a resume rewinds by GRPO step).

        The LLM judges' counters since the last record (`mcprl_env.judge.judge_metrics`) join it.
        """
        record: dict[str, Any] = {"stage": self.state.stage, "sft_step": self.state.sft_step}
        if tag is not None:
            record["tag"] = tag
        record.update({k: float(v) for k, v in (metrics | judge_metrics()).items()})
        self.history.append({"kind": kind, "step": step, **record})
        self.sinks.write_metrics(kind, step, record)

    # -- checkpoints -------------------------------------------------------------------------------------

    def checkpoint(self) -> None:
        """Weights, optimizer/scheduler/RNG states, stage, step and data position, atomically (collective)."""
        assert self.learner is not None
        assert self.backend is not None
        self.phases.announce("checkpoint", self.state)
        self.state.elapsed_s = self.elapsed()
        manager = self.run_dir.checkpoints
        parts = self.backend.save_partitions(manager.root)
        if self.is_writer:
            state_dicts: dict[str, Any] = {"learner": self.learner.state_dict()}
            if self.sft is not None:
                state_dicts["sft"] = self.sft.state_dict()
            manager.save(
                self.state.step,
                writers={"policy": self.backend.sampling_policy.save_pretrained, **parts},
                state_dicts=state_dicts,
                meta={
                    "state": self.state.to_dict(),
                    "logs": self.run_dir.log_marks(),
                    **self.backend.checkpoint_meta(),
                },
            )
        collectives.barrier()
        self.emit("after_checkpoint")

    def restore(self, loaded: Checkpoint | None) -> None:
        """Restore from a loaded checkpoint (weights were loaded with the policy) and rewind the logs to it;
        without a checkpoint the run starts over and the logs are cleared."""
        assert self.learner is not None
        assert self.stream is not None
        assert self.backend is not None
        if loaded is None:
            logger.warning("resume_without_checkpoint", run_dir=str(self.run_dir.path))
            if self.is_writer:
                self.run_dir.rewind(-1)
            return
        self.backend.load_partitions(loaded.path)
        self.state = TrainState.resumed(loaded.meta["state"], grpo_steps=self.config.run.steps)
        self.learner.load_state_dict(loaded.state("learner"))
        if self.sft is not None and loaded.has_state("sft"):
            self.sft.load_state_dict(loaded.state("sft"))
        loaded.restore_rng()
        self.stream.position = self.state.position
        self.sync_sampler()
        self.synced_step = self.state.step
        if self.is_writer:
            self.run_dir.rewind(self.state.step, marks=loaded.meta.get("logs"))
            self.history = self.run_dir.read_metrics().records  # the summary covers the whole run
        self.restored_from = str(loaded.path)
        logger.info("resumed", checkpoint=loaded.path.name, stage=self.state.stage, step=self.state.step)

    def finish(self) -> dict[str, Any]:
        """Hand the run's summary to the sinks (`summary.json`, the console) and return it; in a data-parallel
        run every rank also writes its record of the weights it finished with (`mcprl_train.run.ranks`)."""
        self.phases.announce("summary", self.state)
        summary = run_summary(
            self.history,
            run_dir=self.run_dir.path,
            state=self.state,
            grpo_steps=self.config.run.steps,
            elapsed_s=self.elapsed(),
            val_tasks=len(self.val_tasks),
            teacher_success=self.teacher_success,
            resumed_from=self.restored_from,
        )
        self.sinks.write_summary(summary)
        if self.world > 1:
            assert self.backend is not None
            write_rank_record(self.run_dir, self.backend.sampling_policy, step=self.state.step)
            collectives.barrier()
        return summary
