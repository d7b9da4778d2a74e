"""The run's phase record ``phases.jsonl``: one line each time the trainer moves to another phase.

A line is ``{"phase", "stage", "step", "sft_step", "tag", "time"}``: the phase (`Phase`), the trainer's stage
and steps when it began (``step`` is the GRPO step the phase works on: the one being collected or learned on),
the evaluation's tag, and the wall-clock time (``time.time()``). The last complete line says where a run was
when it died (a SIGKILL, the OOM killer); a resumed run appends to the same file, so it also holds every
attempt's history. One small append per phase change, no fsync: a killed process's page cache survives it.

The kill-and-resume harness (``tests/kill_resume.py``) reads it to aim kills at phases of a reference run and
to name where each landed.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Literal, Protocol

__all__ = ["PHASES_FILE", "Phase", "PhaseLog", "Position"]

PHASES_FILE = "phases.jsonl"

Phase = Literal[
    "startup",
    "warm_start",
    "evaluation",
    "collection",
    "update",
    "update_and_collection",
    "records",
    "checkpoint",
    "summary",
]
"""``startup``: tasks, model, servers, restoring a checkpoint. ``warm_start``: SFT steps. ``evaluation``: a
validation (``tag``). ``collection``: a GRPO step's rollouts. ``update``: its learner update and the samplers'
sync (``update_and_collection`` with ``collection.overlap``: the next step collected beside it). ``records``:
the step's metrics and episodes written. ``checkpoint``: a checkpoint written. ``summary``: the summary, plots
and trackers at the end."""


class Position(Protocol):
    """Where the trainer is (`mcprl_train.loop.state.TrainState`)."""

    @property
    def stage(self) -> str: ...
    @property
    def step(self) -> int: ...
    @property
    def sft_step(self) -> int: ...


class PhaseLog:
    """Appends a `PhaseMark` to ``path`` when the phase changes (``path`` None: writes nothing, e.g. rank > 0)."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self.current: tuple[Phase, str, int] | None = None

    def announce(
        self, phase: Phase, position: Position, *, step: int | None = None, tag: str | None = None
    ) -> None:
        """Record the start of ``phase`` at ``position``; nothing when it is the phase already under way (the
        same phase of the same stage and GRPO step: the warm start announces itself before each SFT step).

        Args:
            step: The GRPO step the phase works on, when it is not ``position.step`` (a step's collection and
                update happen before the trainer counts the step as done).
        """
        step = position.step if step is None else step
        if (phase, position.stage, step) == self.current or self.path is None:
            return
        self.current = (phase, position.stage, step)
        line = {
            "phase": phase,
            "stage": position.stage,
            "step": step,
            "sft_step": position.sft_step,
            "tag": tag,
            "time": time.time(),
        }
        with self.path.open("a", encoding="utf-8") as handle:
            handle.write(json.dumps(line) + "\n")
