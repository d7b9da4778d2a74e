"""Kill a real ``mcprl-train`` run with SIGKILL at random points, resume it each time, and compare the result.

`kill_and_resume` starts ``python -m mcprl_train train`` and, for each of ``kills`` attempts, SIGKILLs it at a
point drawn from a seeded schedule (`draw_trigger`): a random time after the attempt started, or a moment the
run announces (a line of ``training.log``, a checkpoint's temporary directory appearing) plus a random delay.
Each kill is followed by ``--resume``; after the last kill the run goes to the end. Where each kill landed is
read from the run directory at that moment (`landed_phase`), so the coverage of phases is visible.
`mcprl_train.run.compare.run_differences` then compares the run with an uninterrupted one.

SIGKILL goes to the trainer alone, as the OOM killer would send it; its MCP servers lose their stdin and must
exit by themselves (`Kill.orphans` counts those still alive 10 s later; they are then killed).
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Literal, assert_never

import attrs

from mcprl_train.run.run_dir import RunDir, read_jsonl

__all__ = [
    "Kill",
    "KillRun",
    "Trigger",
    "draw_trigger",
    "kill_and_resume",
    "landed_phase",
]

TriggerKind = Literal["time", "event", "checkpoint_write"]
_EVENTS = ("sft_step", "validation", "grpo_step", "checkpoint_saved", "mcp_server_ready")


@attrs.frozen(kw_only=True)
class Trigger:
    """When to kill an attempt.

    Attributes:
        kind: ``time`` (``delay_s`` after the attempt started), ``event`` (``delay_s`` after the ``nth`` new
            ``training.log`` line of ``event``), ``checkpoint_write`` (as soon as a checkpoint's temporary
            directory appears: the write is under way).
        event: The log event for ``kind="event"``.
        nth: Which occurrence of ``event`` in this attempt (1-based).
        delay_s: Seconds to wait after the moment.
    """

    kind: TriggerKind
    event: str = ""
    nth: int = 1
    delay_s: float = 0.0

    def describe(self) -> str:
        match self.kind:
            case "time":
                return f"{self.delay_s:.2f} s after start"
            case "event":
                return f"{self.delay_s:.2f} s after {self.event} #{self.nth}"
            case "checkpoint_write":
                return "checkpoint write started"
            case _:
                assert_never(self.kind)


def draw_trigger(rng: random.Random, *, run_s: float) -> Trigger:
    """One kill point: a random time within ``run_s`` (an uninterrupted run's length) or a random moment
    after an announced phase; the mix makes short phases (a checkpoint write, a step's update) reachable."""
    kind = rng.choice(["time", "time", "event", "event", "event", "checkpoint_write"])
    if kind == "time":
        return Trigger(kind="time", delay_s=rng.uniform(0.0, run_s / 2))  # a resumed attempt has less to do
    if kind == "checkpoint_write":
        return Trigger(kind="checkpoint_write")
    event = rng.choice(_EVENTS)
    nth = (
        rng.randint(1, 10) if event == "sft_step" else rng.randint(1, 2) if event == "checkpoint_saved" else 1
    )
    return Trigger(kind="event", event=event, nth=nth, delay_s=rng.uniform(0.0, 1.0))


@attrs.frozen(kw_only=True)
class Kill:
    """One SIGKILL: when it was aimed, where it landed, and what it left."""

    attempt: int
    trigger: str
    phase: str
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
    kills: int,
    seed: int,
    run_s: float,
    logs: Path,
    timeout_s: float = 900.0,
) -> KillRun:
    """Run ``command(resume)`` until it exits 0, SIGKILLing the first ``kills`` attempts at drawn points.

    Args:
        command: The argv of a new run (``False``) or of ``--resume`` (``True``).
        run: The run directory the command writes.
        kills: How many attempts to kill (an attempt that finishes before its point ends the schedule).
        seed: Seeds the kill points.
        run_s: An uninterrupted run's length (bounds ``time`` triggers).
        logs: Where each attempt's stdout and stderr go (``attempt-<i>.log``).
        timeout_s: Per attempt.

    Raises:
        RuntimeError: an attempt exits with an error, or no attempt finishes.
    """
    rng = random.Random(seed)
    logs.mkdir(parents=True, exist_ok=True)
    done: list[Kill] = []
    t0 = time.monotonic()
    for attempt in range(kills + 1):
        resume = (run / "config.yaml").is_file()
        trigger = draw_trigger(rng, run_s=run_s) if attempt < kills else None
        log_start = _size(run / "training.log")
        stale = set(_temporaries(run))
        with (logs / f"attempt-{attempt}.log").open("wb") as out:
            proc = subprocess.Popen(command(resume), stdout=out, stderr=subprocess.STDOUT)
            started = time.monotonic()
            hit = trigger is not None and _wait_for(trigger, proc, run, log_start, stale, started, timeout_s)
            children = _children(proc.pid) if hit else []
            if hit:
                proc.send_signal(signal.SIGKILL)
                hit = proc.wait() == -signal.SIGKILL  # not when it exited on its own just before
            if not hit:
                rc = proc.wait(timeout=max(1.0, timeout_s - (time.monotonic() - started)))
                if rc != 0:
                    raise RuntimeError(
                        f"attempt {attempt} exited {rc}; see {logs / f'attempt-{attempt}.log'}"
                    )
                return KillRun(run=run, kills=tuple(done), attempts=attempt + 1, wall_s=time.monotonic() - t0)
            after = time.monotonic() - started
        assert trigger is not None
        phase = landed_phase(run, log_start, stale)
        done.append(
            Kill(
                attempt=attempt,
                trigger=trigger.describe(),
                phase=phase,
                after_s=after,
                orphans=_reap(children),
            )
        )
    raise RuntimeError(f"the run did not finish after {kills} kills and one last attempt")


def _wait_for(
    trigger: Trigger,
    proc: subprocess.Popen[bytes],
    run: Path,
    log_start: int,
    stale: set[str],
    started: float,
    timeout_s: float,
) -> bool:
    """Wait for the trigger's moment; False when the process exits first."""
    fire_at: float | None = started + trigger.delay_s if trigger.kind == "time" else None
    while True:
        now = time.monotonic()
        if proc.poll() is not None:
            return False
        if now - started > timeout_s:
            proc.kill()
            raise RuntimeError(f"attempt ran past {timeout_s} s")
        if fire_at is None:
            match trigger.kind:
                case "event":
                    seen = [e for e in _events(run, log_start) if e.get("event") == trigger.event]
                    if len(seen) >= trigger.nth:
                        fire_at = now + trigger.delay_s
                case "checkpoint_write":
                    if set(_temporaries(run)) - stale:
                        fire_at = now
                case "time":
                    pass
                case _:
                    assert_never(trigger.kind)
        if fire_at is not None and now >= fire_at:
            return True
        time.sleep(0.002 if trigger.kind == "checkpoint_write" else 0.01)


def landed_phase(run: Path, log_start: int, stale: set[str]) -> str:
    """Where the run was when it died, read from what it left: files, torn lines, its last log event."""
    if not (run / "config.yaml").is_file():
        return "startup: before the run directory"
    if set(_temporaries(run)) - stale:
        return "checkpoint write (temporary directory half written)"
    for name in ("metrics.jsonl", "trajectories.jsonl"):
        if read_jsonl(run / name).torn_line is not None:
            return f"append to {name} (torn last line)"
    events = [e for e in _events(run, log_start) if e.get("event") in (*_EVENTS, "resumed", "run_finished")]
    if not events:
        return "startup: model, servers"
    last = events[-1]
    match last.get("event"):
        case "mcp_server_ready":
            return "startup: model, servers"
        case "sft_step":
            done, total = str(last.get("step", "0/0")).split("/")
            return "warm start" if done != total else "warm-start evaluation"
        case "validation":
            return f"after the {last.get('tag')} evaluation, before its checkpoint"
        case "grpo_step":
            return f"GRPO step {str(last.get('step')).split('/')[0]}: logging, trajectories, checkpoint"
        case "run_finished":
            return "after the summary (plots, trackers)"
        case _:
            return _after_checkpoint(run, events)


def _after_checkpoint(run: Path, events: list[dict[str, Any]]) -> str:
    """After a checkpoint or a resume from one: more warm start, the next step, the final evaluation or the
    summary."""
    last = events[-1]
    before = events[-2] if len(events) > 1 else {}
    if last.get("event") == "resumed":
        stage = last.get("stage")
    elif before.get("event") == "validation" and before.get("tag") == "final":
        stage = "done"
    elif before.get("event") == "sft_step":
        stage = "sft"
    else:
        stage = "grpo"
    step = int(last.get("step") or 0)
    if stage == "sft":
        return "warm start"
    if stage == "done":
        return "final checkpoint written: summary"
    if step < RunDir.open(run).load_config().run.steps:
        return f"GRPO step {step + 1}: collection or update"
    return "final evaluation"


def train_command(overrides: Sequence[str], run: Path) -> Callable[[bool], list[str]]:
    """``python -m mcprl_train train --profile cpu --set ...``, with ``--resume <run>`` when resuming."""
    sets = [x for o in overrides for x in ("--set", o)]
    base = [sys.executable, "-m", "mcprl_train", "train", "--profile", "cpu", *sets]
    return lambda resume: [*base, "--resume", str(run)] if resume else base


def _size(path: Path) -> int:
    return path.stat().st_size if path.exists() else 0


def _temporaries(run: Path) -> list[str]:
    root = run / "checkpoints"
    return [p.name for p in root.glob(".tmp-step-*")] if root.is_dir() else []


def _events(run: Path, start: int) -> list[dict[str, Any]]:
    path = run / "training.log"
    if not path.exists():
        return []
    with path.open("rb") as handle:
        handle.seek(start)
        data = handle.read()
    out: list[dict[str, Any]] = []
    for line in data.split(b"\n"):
        try:
            value = json.loads(line)
        except ValueError:
            continue
        if isinstance(value, dict):
            out.append(value)  # pyright: ignore[reportUnknownArgumentType]
    return out


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
