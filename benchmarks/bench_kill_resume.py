"""Many SIGKILLs aimed at every phase of a run, each followed by ``--resume``: does every killed run equal the
uninterrupted one?

One uninterrupted run of the short demo run (`test_kill_resume.short_run`: the tiny model warm-started to call
the demo's finance, calculator and messaging stdio servers, GRPO steps with a checkpoint each, the warm-start
and final evaluations); its ``phases.jsonl`` is the timeline over which ``--kills`` points are drawn for each
of ``--runs`` runs (`kill_resume.draw_schedule` in packages/mcprl-train/tests, seeded by ``--seed``: an equal share per kind
of phase). Each killed run is compared with the uninterrupted one (`run_compare.run_differences`, beside it).
Prints the kills by phase (aimed at, landed in) and, with ``--write``, rewrites its section of
benchmarks/RESULTS.md after every run.

    OMP_NUM_THREADS=1 uv run python benchmarks/bench_kill_resume.py --runs 1 --kills 25 --seed 1 --write
"""

from __future__ import annotations

import argparse
import collections
import importlib.util
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType

import attrs
from results_md import replace_section

_TESTS = Path(__file__).resolve().parents[1] / "packages/mcprl-train/tests"
sys.path.insert(
    0, str(_TESTS)
)  # the harness and the test kit are top-level modules beside mcprl-train's tests

from kill_resume import (  # noqa: E402
    Kill,
    Segment,
    draw_schedule,
    kill_and_resume,
    reference_timeline,
    train_command,
)
from run_compare import max_logprob_gap, run_differences  # noqa: E402

SECTION = "## random SIGKILL and resume: 20+ kills (issue 18, 2026-11-25)"


@attrs.frozen(kw_only=True)
class Row:
    run: int
    kills: tuple[Kill, ...]
    attempts: int
    differences: list[str]
    bitwise: bool
    logprob_gap: float
    wall_s: float


def _test_module() -> ModuleType:
    """The test's run definition, so the benchmark and the test kill the same run."""
    spec = importlib.util.spec_from_file_location("test_kill_resume", _TESTS / "test_kill_resume.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--kills", type=int, default=25, help="kills per run")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--steps", type=int, default=3, help="GRPO steps of the run")
    parser.add_argument("--work", type=Path, default=None, help="where the runs go (default: a temp dir)")
    parser.add_argument(
        "--reuse-straight",
        action="store_true",
        help="reuse <work>/runs/straight, an earlier uninterrupted run",
    )
    parser.add_argument("--write", action="store_true", help="rewrite the section of benchmarks/RESULTS.md")
    args = parser.parse_args()
    test = _test_module()
    work = args.work or Path(tempfile.mkdtemp(prefix="kill-resume-"))
    work.mkdir(parents=True, exist_ok=True)
    root = work / "runs"
    tasks = work / "tasks.json" if args.reuse_straight else test.demo_tasks(work / "tasks.json", 1)
    load = os.getloadavg()[0]
    t0 = time.monotonic()
    straight = root / "straight" if args.reuse_straight else test.straight_run(root, tasks, steps=args.steps)
    timeline = reference_timeline(straight)
    rows: list[Row] = []
    for i in range(args.runs):
        name = f"killed-{i}"
        schedule = draw_schedule(timeline, args.kills, seed=args.seed * 1000 + i)
        print(json.dumps({"run": name, "aimed": [p.describe() for p in schedule.points]}), flush=True)
        result = kill_and_resume(
            train_command(test.short_run(root, name, tasks, steps=args.steps), root / name),
            root / name,
            schedule=schedule,
            logs=work / f"attempts-{i}",
        )
        rows.append(
            Row(
                run=i,
                kills=result.kills,
                attempts=result.attempts,
                differences=run_differences(straight, root / name, exact=False),
                bitwise=not run_differences(straight, root / name),
                logprob_gap=max_logprob_gap(straight, root / name),
                wall_s=result.wall_s,
            )
        )
        text = _section(rows, timeline=timeline, load=load, args=args)
        made = "reused, not included" if args.reuse_straight else "included"
        text += f"\nWall time in all (the uninterrupted run {made}): {time.monotonic() - t0:.0f} s; load "
        text += f"{os.getloadavg()[0]:.1f} at the end.\n"
        print(text, flush=True)
        if args.write:  # after every run, so a long benchmark cut short keeps what it measured
            replace_section(text)


def _section(rows: list[Row], *, timeline: list[Segment], load: float, args: argparse.Namespace) -> str:
    timeline_s = timeline[-1].start_s + timeline[-1].duration_s
    spent: dict[str, float] = collections.defaultdict(float)
    for segment in timeline:
        spent[segment.mark.phase] += segment.duration_s
    kills = [k for r in rows for k in r.kills]
    aimed = collections.Counter(k.aimed_phase for k in kills)
    landed = collections.Counter(k.phase for k in kills)
    in_writes = sum(k.detail is not None and k.detail.startswith("checkpoint temporary") for k in kills)
    phases = sorted(aimed.keys() | landed.keys(), key=lambda p: (-landed[p], p))
    command = (
        f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', '(unset)')} uv run python "
        f"benchmarks/bench_kill_resume.py --runs {args.runs} --kills {args.kills} --seed {args.seed}"
        f"{'' if args.steps == 3 else f' --steps {args.steps}'}{f' --work {args.work} --reuse-straight' if args.reuse_straight else ''}"
    )
    lines = [
        SECTION,
        "",
        f"`{command} --write` (load {load:.1f} at the start on the shared 2-core machine; the uninterrupted run's "
        f"phases span {timeline_s:.0f} s). The kill points are drawn over the uninterrupted run's `phases.jsonl` "
        "(`kill_resume.draw_schedule`: an equal share per kind of phase, a random segment of that kind and a "
        "uniform time within it); attempt i is SIGKILLed (the trainer alone, as the OOM killer does) that long "
        "after it announces point i's phase, or at once if it announces a later phase first (`overtaken`), then "
        "`--resume`. `landed in`: the killed attempt's last line of `phases.jsonl`.",
        "",
        "| phase | its time in the uninterrupted run | kills aimed at it | kills landed in it |",
        "|---|---|---|---|",
        *(f"| {p} | {spent[p]:.2f} s | {aimed[p]} | {landed[p]} |" for p in phases),
        f"| **all** | **{timeline_s:.1f} s** | **{len(kills)}** | **{len(kills)}** |",
        "",
        f"Kills that cut a checkpoint write (its temporary directory half written): {in_writes}. Torn JSONL "
        f"lines: {sum(k.detail is not None and k.detail.startswith('torn') for k in kills)}. Overtaken points: "
        f"{sum(k.aimed.endswith('(overtaken)') for k in kills)}.",
        "",
        "| run | kills | attempts | equal to the uninterrupted run | bit for bit | max sampler logprob difference "
        "| wall |",
        "|---|---|---|---|---|---|---|",
        *(
            f"| {r.run} | {len(r.kills)} | {r.attempts} | "
            f"{'equal' if not r.differences else 'NOT equal: ' + '; '.join(r.differences)[:300]} | "
            f"{'yes' if r.bitwise else 'no'} | {r.logprob_gap:.1e} | {r.wall_s:.0f} s |"
            for r in rows
        ),
        "",
        "`equal`: `run_differences(..., exact=False)` as in the sections above (tokens, messages, rewards, every "
        "metric but the sampler's batching counters and the mismatch metrics computed from its logprobs, the "
        "summary and the final weights' sha256 bit for bit; the sampler's logprobs within 1e-4).",
        "",
        "Per kill (run.attempt: aimed -> landed in, what the files show, seconds into the attempt):",
        "",
        *(
            f"- {r.run}.{k.attempt}: {k.aimed} -> {k.where}{f' ({k.detail})' if k.detail else ''}, {k.after_s:.1f} s"
            for r in rows
            for k in r.kills
        ),
        "",
        f"MCP server processes still alive 10 s after their trainer was killed: {sum(k.orphans for k in kills)}.",
    ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
