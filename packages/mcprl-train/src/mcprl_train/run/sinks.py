"""Where a run's metrics go: one protocol that the run directory, the tracker and the console implement.

The trainer calls `MetricsSink.write_metrics` once per logged record (every SFT step, ``kind="sft"``; GRPO
step, ``"grpo"``; validation, ``"eval"``): a ``metrics.jsonl`` line without the run directory's own fields, so
``stage``, ``sft_step``, an optional ``tag`` (the validation's occasion: ``init``, ``warm_start``,
``periodic``, ``final``), then the metrics; SFT records carry GRPO step 0. `MetricsSink.write_episodes` gets
every episode of a GRPO step (`mcprl_train.loop.collection.Collection.trajectory_records`), retried attempts
included; `MetricsSink.write_summary` the run's summary at the end. Implementations: `run_dir.RunDir`,
`tracking.Tracker`, `ConsoleSink` and `SinkGroup` (all of them behind one).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Literal, Protocol

import structlog

if TYPE_CHECKING:
    from mcprl_train.config import Config

__all__ = ["ConsoleSink", "MetricKind", "MetricsSink", "Record", "SinkGroup"]

logger = structlog.get_logger()

MetricKind = Literal["sft", "grpo", "eval"]
Record = Mapping[str, float | str | int]

_SFT_LINES = 20  # the warm start logs about this many lines, whatever its length


class MetricsSink(Protocol):
    """Receives a run's metrics records, episodes and summary as the trainer produces them."""

    def write_metrics(self, kind: MetricKind, step: int, record: Record) -> None: ...

    def write_episodes(self, step: int, episodes: Sequence[Mapping[str, object]]) -> None: ...

    def write_summary(self, summary: Mapping[str, object]) -> None: ...


class SinkGroup:
    """Several sinks behind one: each call goes to every sink, in order.

    Args:
        sinks: The sinks; put the run directory first so a record is on disk before it is shown or sent.
    """

    def __init__(self, sinks: Sequence[MetricsSink]) -> None:
        self.sinks = tuple(sinks)

    def write_metrics(self, kind: MetricKind, step: int, record: Record) -> None:
        for sink in self.sinks:
            sink.write_metrics(kind, step, record)

    def write_episodes(self, step: int, episodes: Sequence[Mapping[str, object]]) -> None:
        for sink in self.sinks:
            sink.write_episodes(step, episodes)

    def write_summary(self, summary: Mapping[str, object]) -> None:
        for sink in self.sinks:
            sink.write_summary(summary)


class ConsoleSink:
    """One structlog line per GRPO step (``grpo_step``), per validation (``validation``), about every twentieth
    SFT step (``sft_step``), and at the end (``run_finished``: the summary's non-null fields).

    Args:
        config: The resolved config (``run.steps`` is the GRPO length shown as ``step=k/N``).
        sft_steps: The warm start's length (``SFTStage.total_steps``); defaults to ``sft.steps``, which
            is null when the warm start runs by epochs: then the trainer must pass the length it computed
            from the demonstrations.

    Raises:
        ValueError: the warm start is enabled and its length is neither given nor in the config.
    """

    def __init__(self, config: Config, *, sft_steps: int | None = None) -> None:
        self.grpo_steps = config.run.steps
        total = sft_steps if sft_steps is not None else config.sft.steps
        if config.sft.enabled and total is None:
            raise ValueError("ConsoleSink: sft.steps is null (the warm start runs by epochs); pass sft_steps")
        self.sft_steps = total or 0
        self._sft_eta = _Eta()
        self._grpo_eta = _Eta()

    def write_metrics(self, kind: MetricKind, step: int, record: Record) -> None:
        match kind:
            case "grpo":
                self._grpo_line(step, record)
            case "sft":
                self._sft_line(record)
            case "eval":
                self._validation_line(step, record)

    def write_episodes(self, step: int, episodes: Sequence[Mapping[str, object]]) -> None:
        """Episodes are not shown: the step's line summarises them."""

    def write_summary(self, summary: Mapping[str, object]) -> None:
        logger.info("run_finished", **{k: v for k, v in summary.items() if v is not None})

    def _grpo_line(self, step: int, m: Record) -> None:
        logger.info(
            "grpo_step",
            step=f"{step}/{self.grpo_steps}",
            reward=round(_num(m, "rollout/reward_mean"), 3),
            success=round(_num(m, "rollout/success_rate"), 3),
            kl=round(_num(m, "loss/kl"), 4),
            tool_errors=round(_num(m, "tools/error_rate"), 3),
            invalid=round(_num(m, "rollout/invalid_rate"), 3),
            invalid_pre_retry=round(_num(m, "rollout/pre_retry/invalid_rate"), 3),
            retried_groups=int(_num(m, "rollout/retried_groups")),
            zero_std=round(_num(m, "adv/zero_std_frac"), 2),
            clip=round(_num(m, "ratio/clip_frac"), 3),
            step_s=round(_num(m, "perf/step_s"), 1),
            elapsed_s=round(_num(m, "time/elapsed_s"), 0),
            eta_s=self._grpo_eta.after(_num(m, "perf/step_s"), self.grpo_steps - step),
        )

    def _sft_line(self, m: Record) -> None:
        total = self.sft_steps
        sft_step = int(_num(m, "sft_step"))
        eta = self._sft_eta.after(_num(m, "perf/sft_step_s"), total - sft_step)
        if sft_step % max(1, total // _SFT_LINES) == 0 or sft_step == total:
            logger.info(
                "sft_step",
                step=f"{sft_step}/{total}",
                loss=round(_num(m, "sft/loss"), 4),
                token_acc=round(_num(m, "sft/token_acc"), 3),
                turn_acc=round(_num(m, "sft/turn_acc"), 3),
                elapsed_s=round(_num(m, "time/elapsed_s"), 0),
                eta_s=eta,
            )

    def _validation_line(self, step: int, m: Record) -> None:
        logger.info(
            "validation",
            tag=m.get("tag"),
            step=step,
            success=round(_num(m, "val/success_rate"), 3),
            reward=round(_num(m, "val/reward_mean"), 3),
            turns=round(_num(m, "val/turns_mean"), 2),
            tool_errors=round(_num(m, "val/tools/error_rate"), 3),
            tasks=int(_num(m, "val/groups")),  # one group per validation task
            time_s=round(_num(m, "val/time_s"), 1),
        )


class _Eta:
    """Seconds left in a stage: the steps left times the mean step time this process has seen in it.

    Evaluations and checkpoints between steps are not in a step's time, so the estimate leaves them out.
    """

    def __init__(self) -> None:
        self._seconds = 0.0
        self._steps = 0

    def after(self, step_s: float, steps_left: int) -> int:
        self._seconds += step_s
        self._steps += 1
        return round(self._seconds / self._steps * max(0, steps_left))


def _num(record: Record, key: str) -> float:
    value = record.get(key, 0.0)
    return float(value) if isinstance(value, int | float) else 0.0
