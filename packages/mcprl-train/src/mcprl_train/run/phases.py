"""The run's phase record ``phases.jsonl``: one line each time the trainer moves to another phase.

A line is ``{"phase", "stage", "step", "sft_step", "tag", "time"}``: the phase (`Phase`), the trainer's stage
and steps when it began (``step`` is the GRPO step the phase works on: the one being collected or learned on),
the evaluation's tag, and the wall-clock time (``time.time()``). The last complete line says where a run was
when it died (a SIGKILL, the OOM killer); a resumed run appends to the same file, so it also holds every
attempt's history. One small append per phase change, no fsync: a killed process's page cache survives it.

`mcprl_train.run.kill_resume` reads it to aim kills at phases of a reference run and to name where each landed.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Literal, Protocol, assert_never, get_args

import attrs

from mcprl_train.run.run_dir import JsonlReadResult, read_jsonl, read_jsonl_bytes

__all__ = [
    "PHASES_FILE",
    "Phase",
    "PhaseLog",
    "PhaseMark",
    "Position",
    "describe_phase",
    "read_phases",
    "read_phases_bytes",
]

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

_PHASES: tuple[Phase, ...] = get_args(Phase)

PhaseKey = tuple[str, str, int, int, str | None]
"""Which phase of a run a mark is, the clock aside: (phase, stage, step, sft_step, tag)."""


@attrs.frozen(kw_only=True)
class PhaseMark:
    """One line of ``phases.jsonl``."""

    phase: Phase
    stage: str
    step: int
    sft_step: int
    tag: str | None = None
    time: float

    @property
    def key(self) -> PhaseKey:
        """Which phase of the run this is, the clock aside: a resumed run repeats the keys after its checkpoint."""
        return (self.phase, self.stage, self.step, self.sft_step, self.tag)


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


def read_phases(path: Path) -> list[PhaseMark]:
    """The complete lines of a phases file (a torn last line is left out; a missing file is empty).

    Raises:
        ValueError: a line names a phase this version does not know.
    """
    return _marks(read_jsonl(path), str(path))


def read_phases_bytes(data: bytes) -> list[PhaseMark]:
    """`read_phases` of part of a file's contents (whole lines from the start of one)."""
    return _marks(read_jsonl_bytes(data), PHASES_FILE)


def _marks(result: JsonlReadResult, source: str) -> list[PhaseMark]:
    out: list[PhaseMark] = []
    for record in result.records:
        phase = record.get("phase")
        if phase not in _PHASES:
            raise ValueError(f"{source}: unknown phase {phase!r} (known: {', '.join(_PHASES)})")
        tag = record.get("tag")
        out.append(
            PhaseMark(
                phase=phase,
                stage=str(record["stage"]),
                step=int(record["step"]),
                sft_step=int(record["sft_step"]),
                tag=None if tag is None else str(tag),
                time=float(record["time"]),
            )
        )
    return out


def describe_phase(mark: PhaseMark) -> str:
    """``update, GRPO step 2``, ``warm start from SFT step 10``, ``evaluation warm_start``, ..."""
    match mark.phase:
        case "startup" | "summary":
            return mark.phase
        case "warm_start":
            return f"warm start from SFT step {mark.sft_step}"
        case "evaluation":
            return f"evaluation {mark.tag}"
        case "collection" | "update" | "update_and_collection" | "records":
            return f"{mark.phase}, GRPO step {mark.step}"
        case "checkpoint":
            where = f"SFT step {mark.sft_step}" if mark.stage == "sft" else f"GRPO step {mark.step}"
            return f"checkpoint, {where}{' (final)' if mark.stage == 'done' else ''}"
        case _:
            assert_never(mark.phase)
