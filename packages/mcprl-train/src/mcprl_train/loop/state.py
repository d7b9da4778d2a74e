"""What a run is at a moment: its stage and step, the task stream's position, and the seeds derived from them.

`TrainState` is what a checkpoint restores besides weights and optimizer states; with it and the RNG states a
resumed run takes exactly the step an uninterrupted run would have taken next.
"""

from __future__ import annotations

import gc
import random
from collections.abc import Generator
from contextlib import contextmanager
from typing import Any, Literal

import attrs

from mcprl_train.loop.task_stream import StreamPosition
from mcprl_train.typed_torch import manual_seed

__all__ = ["Stage", "TrainState", "sampler_seed", "seed_everything"]

Stage = Literal["sft", "grpo", "done"]


@attrs.define
class TrainState:
    """What a checkpoint must restore besides weights and optimizer states."""

    stage: Stage = "sft"
    step: int = 0
    sft_step: int = 0
    position: StreamPosition = attrs.field(factory=StreamPosition)
    elapsed_s: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return attrs.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrainState:
        return cls(
            stage=data["stage"],
            step=int(data["step"]),
            sft_step=int(data["sft_step"]),
            position=StreamPosition.from_dict(data["position"]),
            elapsed_s=float(data.get("elapsed_s", 0.0)),
        )

    @classmethod
    def resumed(cls, data: dict[str, Any], *, grpo_steps: int) -> TrainState:
        """A checkpoint's state to resume from; a finished run resumed with more ``run.steps`` continues GRPO."""
        state = cls.from_dict(data)
        if state.stage == "done" and state.step < grpo_steps:
            state.stage = "grpo"
        return state


def seed_everything(seed: int) -> None:
    random.seed(seed)
    manual_seed(seed)


def sampler_seed(seed: int, step: int, rank: int) -> int:
    """Rank ``rank``'s sampler seed at GRPO step ``step``: ranks sample differently, a resumed step alike."""
    step_seed = (seed * 1_000_003 + step * 7_919) % (2**31 - 1)
    return (step_seed + 7_919 * rank) % (2**31 - 1)


@contextmanager
def frozen_heap() -> Generator[None]:
    """Keep what exists now (model, tokenizer, tasks, servers' clients) out of the cyclic collector's scans.

    They live for the whole run; without this every full collection walks them again. Reference counting
    still frees them; `gc.unfreeze` hands them back to the collector when the stages end.
    """
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()
