"""Kill a real ``mcprl-train`` run with SIGKILL at random points, resume it each time, and compare the result.

`kill_and_resume` starts ``python -m mcprl_train train`` and, for each of ``kills`` attempts, SIGKILLs it at a
point drawn from a seeded schedule (`draw_trigger`): a random time after the attempt started, or a moment the
run announces (a line of ``training.log``, a checkpoint's temporary directory appearing) plus a random delay.
Each kill is followed by ``--resume``; after the last kill the run goes to the end. Where each kill landed is
read from the run directory at that moment (`landed_phase`), so the coverage of phases is visible.
`run_differences` then compares the run with an uninterrupted one: every metrics record, every episode, the
summary and the final checkpoint's weights, clock readings aside.

SIGKILL goes to the trainer alone, as the OOM killer would send it; its MCP servers lose their stdin and must
exit by themselves (`Kill.orphans` counts those still alive 10 s later; they are then killed).
"""

from __future__ import annotations

import json
import math
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, assert_never

import attrs

from mcprl_train.run.checkpoint import MANIFEST
from mcprl_train.run.run_dir import RunDir, read_jsonl

__all__ = [
    "Kill",
    "KillRun",
    "Trigger",
    "draw_trigger",
    "is_timing",
    "kill_and_resume",
    "landed_phase",
    "run_differences",
]

TriggerKind = Literal["time", "event", "checkpoint_write"]
_EVENTS = ("sft_step", "validation", "grpo_step", "checkpoint_saved", "mcp_server_ready")
_TIMING = ("time", "time/", "perf/", "wall_s", "elapsed_s")


def is_timing(key: str) -> bool:
    """A clock reading (``time/*``, ``perf/*``, ``*_s``, ``*_ms``): the one thing two equal runs may differ in."""
    return key.startswith(_TIMING) or key.endswith(("_s", "_ms"))


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


def run_differences(a: Path, b: Path, *, exact: bool = True) -> list[str]:
    """What differs between two finished runs, clock readings and run names aside (empty: equal).

    Compares every ``metrics.jsonl`` record in order, every episode of ``trajectories.jsonl`` (keyed by step,
    episode id and attempt), ``summary.json`` and the final checkpoint's policy weight files (their sha256 in
    the checkpoint's manifest).

    Args:
        exact: Bit for bit. Otherwise what the sampler's batching decides is compared as runs that batch
            differently agree (benchmarks/RESULTS.md, "reproducible sampling"): its counters (``sampler/*``)
            not at all, the sampler's logprobs within 1e-4 and the metrics computed from them (``mismatch/*``)
            within 1e-3 relative; tokens, messages, rewards, every other metric and the weights still bit for
            bit. Which requests share a forward pass depends on when they arrive, and on the CPU a row's
            logits change in their last bits with the batch's padding.
    """
    out: list[str] = []
    ma, mb = (_metrics(p, exact=exact) for p in (a, b))
    if len(ma) != len(mb):
        out.append(f"metrics: {len(ma)} vs {len(mb)} records")
    for i, (x, y) in enumerate(zip(ma, mb, strict=False)):
        keys = sorted(k for k in x.keys() | y.keys() if not _same(x.get(k), y.get(k), close=_close(k, exact)))
        if keys:
            out.append(f"metrics record {i} ({x.get('kind')} step {x.get('step')}): {keys[:5]}")
    ea, eb = (_episodes(p) for p in (a, b))
    if sorted(ea) != sorted(eb):
        out.append(f"episodes: {len(ea)} vs {len(eb)}, {len(set(ea) ^ set(eb))} not in both")
    differing = [k for k in ea if k in eb and not _same_episode(ea[k], eb[k], exact=exact)]
    if differing:
        out.append(f"{len(differing)} episodes differ, e.g. {differing[:3]}")
    sa, sb = (_summary(p) for p in (a, b))
    if sa != sb:
        out.append(f"summary: {sorted(k for k in sa.keys() | sb.keys() if sa.get(k) != sb.get(k))}")
    out.extend(_weight_differences(a, b))
    return out


def _metrics(run: Path, *, exact: bool) -> list[dict[str, Any]]:
    def kept(key: str) -> bool:
        return key != "run" and not is_timing(key) and (exact or not key.startswith("sampler/"))

    return [{k: v for k, v in r.items() if kept(k)} for r in _records(run, "metrics")]


def _close(key: str, exact: bool) -> bool:
    return not exact and key.startswith("mismatch/")


def _same(x: object, y: object, *, close: bool) -> bool:
    if close and isinstance(x, float) and isinstance(y, float):
        return math.isclose(x, y, rel_tol=1e-3, abs_tol=1e-5)
    return x == y


def _same_episode(x: dict[str, Any], y: dict[str, Any], *, exact: bool) -> bool:
    if exact:
        return x == y
    lx: list[float] = x.get("sampler_logprobs") or []
    ly: list[float] = y.get("sampler_logprobs") or []
    if len(lx) != len(ly) or any(abs(p - q) > 1e-4 for p, q in zip(lx, ly, strict=True)):
        return False
    return {k: v for k, v in x.items() if k != "sampler_logprobs"} == {
        k: v for k, v in y.items() if k != "sampler_logprobs"
    }


def _episodes(run: Path) -> dict[tuple[int, str, int], dict[str, Any]]:
    out: dict[tuple[int, str, int], dict[str, Any]] = {}
    for r in _records(run, "trajectories"):
        metrics: Mapping[str, Any] = r.get("metrics") or {}
        record = {k: v for k, v in r.items() if k != "run"}
        record["metrics"] = {k: v for k, v in metrics.items() if not is_timing(k)}
        out[(int(r["step"]), str(r["episode_id"]), int(r.get("attempt") or 0))] = record
    return out


def _records(run: Path, name: Literal["metrics", "trajectories"]) -> list[dict[str, Any]]:
    result = read_jsonl(run / f"{name}.jsonl")
    if result.torn_line is not None or result.bad_lines:
        raise RuntimeError(f"{run.name}/{name}.jsonl has a torn or corrupt line after the run finished")
    return result.records


def _summary(run: Path) -> dict[str, Any]:
    summary: dict[str, Any] = json.loads((run / "summary.json").read_text())
    return {k: v for k, v in summary.items() if k not in ("run_dir", "resumed_from") and not is_timing(k)}


def _weight_differences(a: Path, b: Path) -> list[str]:
    ca, cb = (RunDir.open(p).checkpoints.load_latest() for p in (a, b))
    if ca is None or cb is None:
        return [f"final checkpoint: {ca is not None} vs {cb is not None}"]
    out: list[str] = []
    state_a, state_b = ({k: v for k, v in c.meta["state"].items() if k != "elapsed_s"} for c in (ca, cb))
    if state_a != state_b:
        out.append(f"final checkpoint state: {state_a} vs {state_b}")
    wa, wb = (_weight_hashes(c.path) for c in (ca, cb))
    if not wa or wa != wb:
        out.append(
            f"final weights differ: {sorted(k for k in wa.keys() | wb.keys() if wa.get(k) != wb.get(k))}"
        )
    return out


def _weight_hashes(checkpoint: Path) -> dict[str, str]:
    """The sha256 of each policy weight file, from the checkpoint's verified manifest."""
    files: dict[str, dict[str, Any]] = json.loads((checkpoint / MANIFEST).read_text())["files"]
    return {
        k: str(v["sha256"])
        for k, v in files.items()
        if k.startswith("policy/") and k.endswith(".safetensors")
    }


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
