"""The training loop: warm start (SFT) → GRPO steps (collect → learn → sync) with evaluation and checkpoints.

`Trainer(config, run_dir).run()` returns a summary dict. Resume (`resume=True`) restores the last complete
checkpoint — weights, optimizer, scheduler, RNG states, task-stream position, stage and step — and syncs the
sampler before the first rollout, so the next step equals the one an uninterrupted run would have taken.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import Any, Literal

import anyio
import attrs
import structlog
import torch

from mcprl_train import build
from mcprl_train.loop.collection import check_invalid_rate, collect_groups, rollout_metrics
from mcprl_train.loop.evaluation import evaluate_tasks
from mcprl_train.loop.learner import Learner
from mcprl_train.loop.task_stream import StreamPosition, TaskStream
from mcprl_train.loop.warm_start import SFTStage, render_example
from mcprl_train.run.progress import RunProgress
from mcprl_train.run.run_dir import RunDir

logger = structlog.get_logger()

Stage = Literal["sft", "grpo", "done"]
Hook = Callable[[str, "Trainer"], None]


@attrs.define
class TrainState:
    """What a checkpoint must restore besides weights and optimizer states."""

    stage: Stage = "sft"
    step: int = 0
    sft_step: int = 0
    position: StreamPosition = attrs.field(factory=StreamPosition)
    elapsed_s: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "stage": self.stage,
            "step": self.step,
            "sft_step": self.sft_step,
            "position": self.position.to_dict(),
            "elapsed_s": self.elapsed_s,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrainState:
        return cls(
            stage=data["stage"],
            step=int(data["step"]),
            sft_step=int(data["sft_step"]),
            position=StreamPosition.from_dict(data["position"]),
            elapsed_s=float(data.get("elapsed_s", 0.0)),
        )


def seed_everything(seed: int) -> None:
    random.seed(seed)
    torch.manual_seed(seed)


class Trainer:
    """One training run in a run directory.

    Args:
        config: The resolved `mcprl_train.config.Config`.
        run_dir: The `mcprl_train.run.run_dir.RunDir` (created by the caller with `RunDir.create` / `RunDir.open`).
        resume: Continue from the run directory's last complete checkpoint.
        hooks: Called as `hook(event, trainer)` at `before_rollout`, `after_rollout`, `after_update`,
            `after_step`, `after_checkpoint` (tests use them to inspect or interrupt a run).
        progress: Progress bars (`mcprl_train.run.progress.RunProgress`); None builds them from
            `tracking.progress` (shown only on a terminal).
    """

    def __init__(
        self,
        config: Any,
        run_dir: RunDir,
        *,
        resume: bool = False,
        hooks: tuple[Hook, ...] = (),
        progress: Any = None,
    ) -> None:
        self.config = config
        self.run_dir = run_dir
        self.resume = resume
        self.hooks = hooks
        self.progress = progress if progress is not None else RunProgress(enabled=config.tracking.progress)
        self.state = TrainState(stage="sft" if config.sft.enabled else "grpo")
        self.policy: Any = None
        self.sampler: Any = None
        self.eval_sampler: Any = None
        self.learner: Learner | None = None
        self.sft: SFTStage | None = None
        self.env: Any = None
        self.stream: TaskStream | None = None
        self.val_tasks: list[Any] = []
        self.history: list[dict[str, Any]] = []
        self.last_step_tasks: list[str] = []
        self.restored_from: str | None = None
        self.clock = time.perf_counter()
        self.teacher_success: float | None = None

    def emit(self, event: str) -> None:
        for hook in self.hooks:
            hook(event, self)

    def run(self) -> dict[str, Any]:
        """Run every remaining stage; returns the summary (also written to `summary.json`)."""
        return anyio.run(self.arun)

    async def arun(self) -> dict[str, Any]:
        from mcprl_env import Environment
        from mcprl_tools import ToolManager

        cfg = self.config
        seed_everything(cfg.run.seed)
        loaded = self.find_checkpoint() if self.resume else None
        self.build_learning(loaded)
        train_set = build.load_task_source(cfg.tasks.train, name="train")
        self.stream = TaskStream(train_set, seed=cfg.run.seed)
        if cfg.tasks.validation is not None:
            val_set = build.load_task_source(cfg.tasks.validation, name="validation")
            self.val_tasks = build.first_tasks(val_set, cfg.eval.n_tasks)
        async with ToolManager(build.servers_config(cfg)) as manager:
            self.env = Environment(manager=manager, tokenizer=self.policy.tokenizer, config=cfg.env)
            if cfg.sft.enabled:
                self.sft = SFTStage(
                    policy=self.policy,
                    sft=cfg.sft,
                    optim=cfg.optim,
                    examples=self.demo_examples(),
                    seed=cfg.run.seed,
                )
            if self.resume:
                self.restore(loaded)
            with self.progress:
                return await self.stages()

    def find_checkpoint(self) -> Any:
        """The checkpoint to resume from (`mcprl_train.run.checkpoint.Checkpoint`), or None."""
        return self.run_dir.checkpoints.load_latest()

    def build_learning(self, loaded: Any) -> None:
        """Policy (restored weights when `loaded`), samplers, reference and learner."""
        cfg = self.config
        self.policy = build.build_policy(cfg, source=str(loaded.subdir("policy")) if loaded else None)
        self.policy.train()
        self.sampler = build.build_sampler(cfg, self.policy, seed=cfg.run.seed)
        self.eval_sampler = build.build_sampler(cfg, self.policy, greedy=cfg.eval.greedy, seed=cfg.run.seed)
        reference = build.build_reference(cfg, self.policy)
        self.learner = Learner(
            policy=self.policy, config=cfg, total_steps=cfg.run.steps, seed=cfg.run.seed, reference=reference
        )

    # -- stages ------------------------------------------------------------------------------------------

    async def stages(self) -> dict[str, Any]:
        cfg = self.config
        self.clock = time.perf_counter() - self.state.elapsed_s
        if self.state.stage == "sft":
            # No evaluation of the untrained model here: it cannot call a tool; "warm_start" is the baseline.
            await self.warm_start()
            self.sync_sampler()  # the GRPO rollouts must start from the warm-started weights
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
            every = cfg.eval.every
            if every and self.state.step % every == 0 and self.state.step < cfg.run.steps:
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
        total = self.sft_total_steps()
        self.progress.stage("warm start (SFT)", total=total, completed=self.state.sft_step)
        while self.state.sft_step < total:
            if cfg.max_time_s is not None and self.elapsed() >= cfg.max_time_s:
                logger.info(
                    "sft_time_budget_reached", sft_step=self.state.sft_step, max_time_s=cfg.max_time_s
                )
                break
            metrics = self.sft.train_step()
            self.state.sft_step = self.sft.step
            metrics["time/elapsed_s"] = self.elapsed()
            if self.teacher_success is not None:
                metrics["sft/teacher_success"] = self.teacher_success
            self.log_metrics("sft", self.state.step, metrics)
            self.live_line_sft(metrics, total)
            self.progress.step_done()
            if cfg.eval_every and self.state.sft_step % cfg.eval_every == 0 and self.state.sft_step < total:
                await self.evaluate("sft")

    def sft_total_steps(self) -> int:
        assert self.sft is not None
        cfg = self.config.sft
        if cfg.steps is not None:
            return int(cfg.steps)
        per_epoch = -(-len(self.sft.examples) // cfg.batch_size)
        return per_epoch * cfg.epochs

    async def grpo_step(self) -> dict[str, float]:
        """Collect `tasks_per_step` groups (back-filling zero-variance ones), learn, sync the sampler.

        A sharded subclass overrides the three hooks `step_sampler`, `collect_all` and `update_metrics`; the
        back-fill decision is always taken on every rank's groups, the update on this process's own.
        """
        assert self.stream is not None
        assert self.learner is not None
        cfg = self.config
        step = self.state.step + 1
        t0 = time.perf_counter()
        tasks = self.stream.take(cfg.grpo.tasks_per_step)
        self.step_sampler(step)
        self.last_step_tasks = [t.id for t in tasks]
        self.emit("before_rollout")
        mine, everyone = await self.collect_all(tasks, step, 0)
        invalid_rate = check_invalid_rate(everyone, cfg.run.max_invalid_rate)
        samples, adv = self.learner.prepare(everyone)
        rounds = 0
        while cfg.grpo.filter_zero_std and rounds < cfg.grpo.backfill_rounds:
            kept = int(adv["adv/groups"] * (1.0 - adv["adv/zero_std_frac"]))
            missing = cfg.grpo.tasks_per_step - kept
            if missing <= 0:
                break
            rounds += 1
            extra_tasks = self.stream.take(missing)
            self.last_step_tasks += [t.id for t in extra_tasks]
            extra_mine, extra_all = await self.collect_all(extra_tasks, step, rounds)
            check_invalid_rate(extra_all, cfg.run.max_invalid_rate)
            mine, everyone = [*mine, *extra_mine], [*everyone, *extra_all]
            samples, adv = self.learner.prepare(everyone)
        if len(mine) != len(everyone):  # sharded: learn on this process's groups only
            samples, _ = self.learner.prepare(mine)
        t_collect = time.perf_counter() - t0
        self.emit("after_rollout")
        self.state.position = self.stream.position
        metrics = rollout_metrics(everyone)
        metrics.update(self.sampler.metrics())
        metrics.update(adv)
        metrics["rollout/invalid_rate"] = invalid_rate
        metrics["adv/backfill_rounds"] = float(rounds)
        t1 = time.perf_counter()
        self.progress.work_done()
        metrics.update(self.update_metrics(self.learner.update(samples)))
        self.sync_sampler()
        if cfg.run.ref_sync_every and step % cfg.run.ref_sync_every == 0:
            self.learner.sync_reference()
        self.emit("after_update")
        t_learn = time.perf_counter() - t1
        self.state.step = step
        elapsed = time.perf_counter() - t0
        n_tokens = sum(len(e.token_ids) for g in everyone for e in g.episodes)
        metrics.update(
            {
                "perf/collect_s": t_collect,
                "perf/learn_s": t_learn,
                "perf/step_s": elapsed,
                "perf/tokens_per_s": n_tokens / max(1e-9, elapsed),
                "time/elapsed_s": self.elapsed(),
            }
        )
        self.log_metrics("grpo", step, metrics)
        self.write_trajectories(step, everyone)
        self.live_line(step, metrics)
        self.emit("after_step")
        return metrics

    def step_sampler(self, step: int) -> None:
        """The rollout sampler of GRPO step ``step``."""
        if self.config.sampler.backend == "hf":
            # A fresh generator per step: step k samples alike in a resumed and an uninterrupted run.
            self.sampler = build.build_sampler(
                self.config, self.policy, seed=build.step_seed(self.config.run.seed, step)
            )

    async def collect_all(self, tasks: list[Any], step: int, round_: int) -> tuple[list[Any], list[Any]]:
        """``(this process's groups, every process's groups)`` of ``tasks``: the same groups in one process."""
        groups = await self.collect(tasks, step, round_=round_)
        return groups, groups

    def update_metrics(self, learned: dict[str, float]) -> dict[str, float]:
        """The learner's metrics as logged (a sharded subclass reduces them over the processes)."""
        return learned

    async def collect(self, tasks: list[Any], step: int, *, round_: int) -> list[Any]:
        cfg = self.config
        self.progress.work(
            f"collect step {step}" + (f" (back-fill {round_})" if round_ else ""), total=len(tasks)
        )
        return await collect_groups(
            self.env,
            tasks,
            self.sampler,
            group_size=cfg.grpo.group_size,
            max_concurrent_episodes=cfg.collection.max_concurrent_episodes,
            max_retries=cfg.run.rollout_retries,
            namespace=f"step-{step}" if round_ == 0 else f"step-{step}.{round_}",
            on_group=lambda _group: self.progress.advance(),
        )

    def sync_sampler(self) -> None:
        """Push the new weights to the sampler (a no-op for samplers reading the live weights)."""
        for sampler in (self.sampler, self.eval_sampler):
            sync = getattr(sampler, "sync_weights", None)
            if sync is not None:
                sync()

    async def evaluate(self, tag: str) -> dict[str, float]:
        """Validation metrics (`val/*`) at the current step; logged with `tag` (init, warm_start, ...)."""
        if not self.val_tasks:
            return {}
        self.sync_sampler()  # evaluations inside the warm start run between optimizer steps
        self.policy.eval()
        self.progress.work(f"validate ({tag})", total=len(self.val_tasks))
        try:
            metrics, _ = await evaluate_tasks(
                self.env,
                self.val_tasks,
                self.eval_sampler,
                max_concurrent_episodes=self.config.collection.max_concurrent_episodes,
                namespace=f"eval-{tag}-{self.state.sft_step}-{self.state.step}",
                on_group=lambda _group: self.progress.advance(),
            )
        finally:
            self.policy.train()
            self.progress.work_done()
        metrics["time/elapsed_s"] = self.elapsed()
        self.log_metrics("eval", self.state.step, metrics, tag=tag)
        self.live_line_eval(tag, metrics)
        return metrics

    def elapsed(self) -> float:
        return time.perf_counter() - getattr(self, "clock", time.perf_counter())

    # -- demonstrations ----------------------------------------------------------------------------------

    def demo_examples(self) -> list[Any]:
        """Render the warm-start demonstrations with the tool schemas the environment shows for each task."""
        assert self.stream is not None
        by_id = {}
        tasks = self.stream.tasks
        for i in range(len(tasks)):
            by_id[tasks.task_at(i).id] = i
        out = []
        demos = build.load_demos(self.config)
        self.teacher_success = sum(ok for _, _, ok in demos) / max(1, len(demos))
        logger.info("demonstrations", demos=len(demos), teacher_success=round(self.teacher_success, 3))
        for task_id, messages, _ in demos:
            task = tasks.task_at(by_id[task_id])
            out.append(
                render_example(self.policy.tokenizer, messages, list(self.env.tool_access(task).schemas))
            )
        return out

    # -- records -----------------------------------------------------------------------------------------

    def log_metrics(self, kind: str, step: int, metrics: dict[str, float], *, tag: str | None = None) -> None:
        """One `metrics.jsonl` record; SFT records carry GRPO step 0 (so a resume rewinds by GRPO step)."""
        record: dict[str, Any] = {"stage": self.state.stage, "sft_step": self.state.sft_step}
        if tag is not None:
            record["tag"] = tag
        record.update({k: float(v) for k, v in metrics.items()})
        self.history.append({"kind": kind, "step": step, **record})
        self.run_dir.append_metrics(step, record, kind=kind)

    def write_trajectories(self, step: int, groups: list[Any]) -> None:
        """Every episode of the step, one JSON line each (crash-safe, deduplicated by the run dir)."""
        self.run_dir.append_trajectories(step, (e.to_dict() for g in groups for e in g.episodes))

    # -- checkpoints -------------------------------------------------------------------------------------

    def checkpoint(self) -> None:
        """Save weights, optimizer/scheduler/RNG states, stage, step and data position atomically."""
        assert self.learner is not None
        self.state.elapsed_s = self.elapsed()
        state_dicts: dict[str, Any] = {"learner": self.learner.state_dict()}
        if self.sft is not None:
            state_dicts["sft"] = self.sft.state_dict()
        self.run_dir.checkpoints.save(
            self.state.step,
            writers={"policy": self.policy.save_pretrained},
            state_dicts=state_dicts,
            meta={"state": self.state.to_dict()},
        )
        self.emit("after_checkpoint")

    def restore(self, loaded: Any) -> None:
        """Restore from a loaded checkpoint (weights were loaded with the policy); rewind the logs to it.

        Without a checkpoint the run starts over and the logs are cleared.
        """
        assert self.learner is not None
        assert self.stream is not None
        if loaded is None:
            logger.warning("resume_without_checkpoint", run_dir=str(self.run_dir.path))
            self.run_dir.rewind(-1)
            return
        self.state = self.restored_state(loaded)
        self.learner.load_state_dict(loaded.state("learner"))
        if self.sft is not None and loaded.has_state("sft"):
            self.sft.load_state_dict(loaded.state("sft"))
        loaded.restore_rng()
        self.stream.position = self.state.position
        self.sync_sampler()
        self.run_dir.rewind(self.state.step)
        self.restored_from = str(loaded.path)
        logger.info("resumed", checkpoint=loaded.path.name, stage=self.state.stage, step=self.state.step)

    def restored_state(self, loaded: Any) -> TrainState:
        """The checkpoint's `TrainState`; a finished run resumed with a larger `run.steps` continues GRPO."""
        state = TrainState.from_dict(loaded.meta["state"])
        if state.stage == "done" and state.step < self.config.run.steps:
            state.stage = "grpo"
        return state

    # -- console -----------------------------------------------------------------------------------------

    def live_line(self, step: int, m: dict[str, float]) -> None:
        """One line per GRPO step: reward, success rate, KL, tool errors, ratio health, timing."""
        logger.info(
            "grpo_step",
            step=f"{step}/{self.config.run.steps}",
            reward=round(m.get("rollout/reward_mean", 0.0), 3),
            success=round(m.get("rollout/success_rate", 0.0), 3),
            kl=round(m.get("loss/kl", 0.0), 4),
            tool_errors=round(m.get("tools/error_rate", 0.0), 3),
            zero_std=round(m.get("adv/zero_std_frac", 0.0), 2),
            clip=round(m.get("ratio/clip_frac", 0.0), 3),
            step_s=round(m.get("perf/step_s", 0.0), 1),
            elapsed_s=round(self.elapsed(), 0),
        )

    def live_line_sft(self, m: dict[str, float], total: int) -> None:
        every = max(1, total // 20)
        if self.state.sft_step % every == 0 or self.state.sft_step == total:
            logger.info(
                "sft_step",
                step=f"{self.state.sft_step}/{total}",
                loss=round(m["sft/loss"], 4),
                token_acc=round(m["sft/token_acc"], 3),
                elapsed_s=round(self.elapsed(), 0),
            )

    def live_line_eval(self, tag: str, m: dict[str, float]) -> None:
        logger.info(
            "validation",
            tag=tag,
            step=self.state.step,
            success=round(m.get("val/success_rate", 0.0), 3),
            reward=round(m.get("val/reward_mean", 0.0), 3),
            turns=round(m.get("val/turns_mean", 0.0), 2),
            tool_errors=round(m.get("val/tools/error_rate", 0.0), 3),
            tasks=len(self.val_tasks),
            time_s=round(m.get("val/time_s", 0.0), 1),
        )

    # -- the end -----------------------------------------------------------------------------------------

    def evals(self) -> list[dict[str, Any]]:
        return [r for r in self.history if r["kind"] == "eval"]

    def finish(self) -> dict[str, Any]:
        """Write the run's summary (`summary.json`, see `summary`), log it and return it."""
        import json

        from mcprl_train.run.run_dir import _atomic_write_text

        summary = self.summary()
        _atomic_write_text(self.run_dir.path / "summary.json", json.dumps(summary, indent=2) + "\n")
        logger.info("run_finished", **{k: v for k, v in summary.items() if v is not None})
        return summary

    def summary(self) -> dict[str, Any]:
        """The run's summary: validation before/after each stage, timing, where things are."""
        evals = {r.get("tag"): r for r in self.evals()}
        tags = ("periodic", "final") if self.config.run.steps > 0 else ("sft", "warm_start")
        last_evals = [r for r in self.evals() if r.get("tag") in tags]

        def val(tag: str, key: str) -> float | None:
            r = evals.get(tag)
            return None if r is None or key not in r else float(r[key])

        summary: dict[str, Any] = {
            "run_dir": str(self.run_dir.path),
            "steps": self.state.step,
            "sft_steps": self.state.sft_step,
            "elapsed_s": round(self.elapsed(), 1),
            "val_tasks": len(self.val_tasks),
            "success_init": val("init", "val/success_rate"),
            "success_warm_start": val("warm_start", "val/success_rate"),
            "success_final": val("final", "val/success_rate"),
            "teacher_success_demos": self.teacher_success,
            "reward_init": val("init", "val/reward_mean"),
            "reward_warm_start": val("warm_start", "val/reward_mean"),
            "reward_final": val("final", "val/reward_mean"),
            "success_last3_mean": (
                sum(r["val/success_rate"] for r in last_evals[-3:]) / len(last_evals[-3:])
                if last_evals
                else None
            ),
            "resumed_from": self.restored_from,
        }
        return summary
