"""Kill a real ``mcprl-train`` run with SIGKILL at points drawn over a reference run, resume it each time.

An uninterrupted run's ``phases.jsonl`` (`mcprl_train.run.phases`) is its timeline: which phase (warm start,
evaluation, a step's collection, its update, its records, a checkpoint, the summary) ran when, and for how long
(`reference_timeline`). `draw_schedule` draws the kill points over it, spread over the kinds of phase: each
point is a phase of the reference run (its key: phase, stage, steps, tag) and a time into it. A run resumed
from a checkpoint repeats the phases after that checkpoint with the same keys, so `kill_and_resume` kills
attempt ``i`` ``offset`` seconds after it announces point ``i``'s phase (or at once when it announces a later
phase first), resumes it with ``--resume``, and goes on until every point was used; the last attempt runs to
the end. Each kill's record names the phase it landed in (the killed attempt's last line of ``phases.jsonl``).
`run_compare.run_differences` then compares the run with the uninterrupted one.

SIGKILL goes to the trainer alone, as the OOM killer would send it; its MCP servers lose their stdin and must
exit by themselves (`Kill.orphans` counts those still alive 10 s later; they are then killed).
"""

from __future__ import annotations

import collections
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import assert_never, get_args

import attrs

from mcprl_train.run.phases import PHASES_FILE, Phase
from mcprl_train.run.run_dir import JsonlReadResult, read_jsonl, read_jsonl_bytes

__all__ = [
    "Kill",
    "KillPoint",
    "KillRun",
    "KillSchedule",
    "PhaseKey",
    "PhaseMark",
    "Segment",
    "describe_phase",
    "draw_schedule",
    "kill_and_resume",
    "landed",
    "read_phases",
    "read_phases_bytes",
    "reference_timeline",
    "train_command",
]


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


@attrs.frozen(kw_only=True)
class Segment:
    """One phase of the reference run: its first `PhaseMark`, position in the run and length."""

    mark: PhaseMark
    index: int
    start_s: float
    duration_s: float


def reference_timeline(run: Path) -> list[Segment]:
    """The phases of an uninterrupted, finished run, in order (the last one ends with the run's last file write).

    Raises:
        ValueError: no ``phases.jsonl``, a run that was resumed (more than one ``startup``), or a phase that
            occurs twice (a kill point could not tell them apart).
    """
    marks = read_phases(run / PHASES_FILE)
    if not marks:
        raise ValueError(
            f"{run}: no {PHASES_FILE}; the reference run must be made by this version of mcprl-train"
        )
    if sum(m.phase == "startup" for m in marks) != 1:
        raise ValueError(f"{run}: {PHASES_FILE} holds several attempts; the reference must be uninterrupted")
    repeated = [k for k, n in collections.Counter(m.key for m in marks).items() if n > 1]
    if repeated:
        raise ValueError(f"{run}: phases announced twice: {repeated[:3]}")
    end = max(p.stat().st_mtime for p in run.rglob("*") if p.is_file())
    t0 = marks[0].time
    stops = [m.time for m in marks[1:]] + [max(end, marks[-1].time)]
    return [
        Segment(mark=m, index=i, start_s=m.time - t0, duration_s=stop - m.time)
        for i, (m, stop) in enumerate(zip(marks, stops, strict=True))
    ]


@attrs.frozen(kw_only=True)
class KillPoint:
    """Kill ``offset_s`` seconds after the run announces the reference's segment ``index`` (key ``key``)."""

    phase: Phase
    key: PhaseKey
    index: int
    offset_s: float
    at_s: float
    label: str

    def describe(self) -> str:
        return f"{self.offset_s:.2f} s into {self.label}"


@attrs.frozen(kw_only=True)
class KillSchedule:
    """Kill points in run order, and the reference's phases in order (a phase announced after a point's own
    means the point was passed: its phase had finished before the previous kill)."""

    points: tuple[KillPoint, ...]
    order: dict[PhaseKey, int]

    def per_phase(self) -> dict[Phase, int]:
        return dict(collections.Counter(p.phase for p in self.points))


def draw_schedule(segments: Sequence[Segment], kills: int, seed: int) -> KillSchedule:
    """``kills`` points in run order, an equal share (±1) for each kind of phase the reference run went through.

    Within a kind, a point takes one of its segments at random and a uniform time within it: a kind's share does
    not depend on how long it runs, so short phases (a checkpoint write, an update) get as many kills as the
    long ones (the warm start, a collection).
    """
    if kills < 0:
        raise ValueError(f"kills must be >= 0, got {kills}")
    rng = random.Random(seed)
    by_phase: dict[Phase, list[Segment]] = collections.defaultdict(list)
    for segment in segments:
        by_phase[segment.mark.phase].append(segment)
    kinds = sorted(by_phase)
    if not kinds:
        raise ValueError("the reference timeline is empty")
    shares = dict.fromkeys(kinds, kills // len(kinds))
    for kind in rng.sample(kinds, kills % len(kinds)):
        shares[kind] += 1
    points: list[KillPoint] = []
    for kind in kinds:
        for _ in range(shares[kind]):
            segment = rng.choice(by_phase[kind])
            offset = rng.uniform(0.0, segment.duration_s)
            points.append(
                KillPoint(
                    phase=kind,
                    key=segment.mark.key,
                    index=segment.index,
                    offset_s=offset,
                    at_s=segment.start_s + offset,
                    label=describe_phase(segment.mark),
                )
            )
    return KillSchedule(
        points=tuple(sorted(points, key=lambda p: (p.index, p.offset_s))),
        order={s.mark.key: s.index for s in segments},
    )


@attrs.frozen(kw_only=True)
class Kill:
    """One SIGKILL: where it was aimed, where it landed, and what it left.

    Attributes:
        aimed: The kill point (`KillPoint.describe`), ``(overtaken)`` when the attempt announced a later phase
            before the point's own (the point's phase had finished in the previous attempt, e.g. a checkpoint
            that was complete when that attempt died).
        phase: The phase the kill landed in (the attempt's last line of ``phases.jsonl``; ``startup`` when it
            had written none yet).
        where: That phase described (`describe_phase`).
        detail: What the kill cut, when the files show it: a checkpoint's temporary directory, a torn line.
    """

    attempt: int
    aimed: str
    aimed_phase: Phase
    phase: Phase
    where: str
    detail: str | None
    after_s: float
    orphans: int


@attrs.frozen(kw_only=True)
class KillRun:
    """A run killed ``len(kills)`` times and resumed to its end."""

    run: Path
    kills: tuple[Kill, ...]
    attempts: int
    wall_s: float


def kill_and_resume(
    command: Callable[[bool], Sequence[str]],
    run: Path,
    *,
    schedule: KillSchedule,
    logs: Path,
    timeout_s: float = 900.0,
    env: Mapping[str, str] | None = None,
) -> KillRun:
    """Run ``command(resume)`` until it exits 0, SIGKILLing attempt ``i`` at ``schedule.points[i]``.

    Args:
        command: The argv of a new run (``False``) or of ``--resume`` (``True``).
        run: The run directory the command writes.
        schedule: The kill points (`draw_schedule`); an attempt that finishes before its point ends the
            schedule.
        logs: Where each attempt's stdout and stderr go (``attempt-<i>.log``).
        timeout_s: Per attempt.
        env: The attempts' environment (default: this process's).

    Raises:
        RuntimeError: an attempt exits with an error or runs past ``timeout_s``.
    """
    logs.mkdir(parents=True, exist_ok=True)
    done: list[Kill] = []
    t0 = time.monotonic()
    points = schedule.points
    for attempt in range(len(points) + 1):
        resume = (run / "config.yaml").is_file()
        point = points[attempt] if attempt < len(points) else None
        since = _size(run / PHASES_FILE)
        stale = set(_temporaries(run))
        with (logs / f"attempt-{attempt}.log").open("wb") as out:
            proc = subprocess.Popen(command(resume), stdout=out, stderr=subprocess.STDOUT, env=env)
            started = time.monotonic()
            fired = _wait_for(schedule, point, proc, run, since, timeout_s) if point is not None else None
            children = _children(proc.pid) if fired is not None else []
            if fired is not None:
                proc.send_signal(signal.SIGKILL)
                if proc.wait() != -signal.SIGKILL:  # it exited on its own just before
                    fired = None
            if fired is None:
                rc = proc.wait(timeout=max(1.0, timeout_s - (time.monotonic() - started)))
                if rc != 0:
                    raise RuntimeError(
                        f"attempt {attempt} exited {rc}; see {logs / f'attempt-{attempt}.log'}"
                    )
                return KillRun(run=run, kills=tuple(done), attempts=attempt + 1, wall_s=time.monotonic() - t0)
            after = time.monotonic() - started
        assert point is not None
        mark, detail = landed(run, since, stale)
        done.append(
            Kill(
                attempt=attempt,
                aimed=point.describe() + (" (overtaken)" if fired == "overtaken" else ""),
                aimed_phase=point.phase,
                phase=mark.phase if mark is not None else "startup",
                where=describe_phase(mark) if mark is not None else "startup: before the trainer (imports)",
                detail=detail,
                after_s=after,
                orphans=_reap(children),
            )
        )
    raise AssertionError("unreachable: the last attempt has no kill point")


def _wait_for(
    schedule: KillSchedule,
    point: KillPoint,
    proc: subprocess.Popen[bytes],
    run: Path,
    since: int,
    timeout_s: float,
) -> str | None:
    """Wait for the point: ``"aimed"`` or ``"overtaken"`` when it is time to kill, None when the process exits."""
    path = run / PHASES_FILE
    started = time.monotonic()
    seen = since
    fire_at: float | None = None
    how = "aimed"
    while True:
        if proc.poll() is not None:
            return None
        if time.monotonic() - started > timeout_s:
            proc.kill()
            raise RuntimeError(f"attempt ran past {timeout_s} s")
        size = _size(path)
        if fire_at is None and size != seen:
            seen = size
            last = _marks_since(path, since)[-1:]
            if last and last[0].key == point.key:
                fire_at = last[0].time + point.offset_s
            elif last and schedule.order.get(last[0].key, -1) > point.index:
                fire_at, how = time.time(), "overtaken"
        if fire_at is not None and time.time() >= fire_at:
            return how
        time.sleep(0.003)


def landed(run: Path, since: int, stale: set[str]) -> tuple[PhaseMark | None, str | None]:
    """Where a killed attempt was: its last phase mark (None: it wrote none) and what the files show it cut."""
    marks = _marks_since(run / PHASES_FILE, since)
    if fresh := sorted(set(_temporaries(run)) - stale):
        detail: str | None = f"checkpoint temporary directory half written ({fresh[0]})"
    else:
        torn = [
            n for n in ("metrics.jsonl", "trajectories.jsonl") if read_jsonl(run / n).torn_line is not None
        ]
        detail = f"torn last line of {torn[0]}" if torn else None
    return (marks[-1] if marks else None), detail


def train_command(overrides: Sequence[str], run: Path) -> Callable[[bool], list[str]]:
    """``python -m mcprl_train train --profile cpu --set ...``, with ``--resume <run>`` when resuming."""
    sets = [x for o in overrides for x in ("--set", o)]
    base = [sys.executable, "-m", "mcprl_train", "train", "--profile", "cpu", *sets]
    return lambda resume: [*base, "--resume", str(run)] if resume else base


def _marks_since(path: Path, start: int) -> list[PhaseMark]:
    """The phase marks appended at or after byte ``start`` (this attempt's)."""
    if not path.exists():
        return []
    with path.open("rb") as handle:
        handle.seek(start)
        data = handle.read()
    return read_phases_bytes(data)


def _size(path: Path) -> int:
    return path.stat().st_size if path.exists() else 0


def _temporaries(run: Path) -> list[str]:
    root = run / "checkpoints"
    return [p.name for p in root.glob(".tmp-step-*")] if root.is_dir() else []


def _children(pid: int) -> list[int]:
    """The process's children (its MCP servers), from every thread's ``children`` list."""
    out: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            out.extend(int(c) for c in (task / "children").read_text().split())
        except OSError:
            continue
    return out


def _reap(pids: list[int], grace_s: float = 10.0) -> int:
    """How many of ``pids`` are still alive ``grace_s`` after their parent died (those are then killed)."""
    deadline = time.monotonic() + grace_s
    alive = list(pids)
    while alive and time.monotonic() < deadline:
        alive = [p for p in alive if _alive(p)]
        time.sleep(0.05)
    for pid in alive:
        os.kill(pid, signal.SIGKILL)
    return len(alive)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"
