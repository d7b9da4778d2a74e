"""Many SIGKILLs at random points, each followed by ``--resume``: does every killed run equal the uninterrupted one?

One uninterrupted run of the short demo run (`test_kill_resume.short_run`: the tiny model warm-started to call
the demo's finance, calculator and messaging stdio servers, GRPO steps with a checkpoint each, the warm-start
and final evaluations), then ``--runs`` runs killed ``--kills`` times each at points drawn from
``--seed`` (`mcprl_train.run.kill_resume.draw_trigger`), each compared with it
(`mcprl_train.run.kill_resume.run_differences`). Prints the kills by phase and, with ``--write``, rewrites
the section of benchmarks/RESULTS.md.

    uv run python benchmarks/bench_kill_resume.py --runs 3 --kills 8 --seed 1 --write
"""

from __future__ import annotations

import argparse
import collections
import importlib.util
import json
import os
import tempfile
import time
from pathlib import Path
from types import ModuleType

from results_md import replace_section

from mcprl_train.run.compare import run_differences
from mcprl_train.run.kill_resume import Kill, kill_and_resume, train_command

SECTION = "## random SIGKILL and resume (issue 18)"
_TEST = Path(__file__).resolve().parents[1] / "packages/mcprl-train/tests/test_kill_resume.py"


def _test_module() -> ModuleType:
    """The test's run definition, so the benchmark and the test kill the same run."""
    spec = importlib.util.spec_from_file_location("test_kill_resume", _TEST)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--kills", type=int, default=8, help="kills per run")
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
    tasks = work / "tasks.json" if args.reuse_straight else test.demo_tasks(work / "tasks.json")
    load = os.getloadavg()[0]
    t0 = time.monotonic()
    if args.reuse_straight:
        straight = root / "straight"
        run_s = float(json.loads((straight / "summary.json").read_text())["elapsed_s"])
    else:
        straight, run_s = test.straight_run(root, tasks, steps=args.steps)
    rows: list[tuple[int, list[Kill], list[str], int, bool]] = []
    for i in range(args.runs):
        name = f"killed-{i}"
        result = kill_and_resume(
            train_command(test.short_run(root, name, tasks, steps=args.steps), root / name),
            root / name,
            kills=args.kills,
            seed=args.seed * 1000 + i,
            run_s=run_s,
            logs=work / f"attempts-{i}",
        )
        differences = run_differences(straight, root / name, exact=False)
        bitwise = not run_differences(straight, root / name)
        rows.append((i, list(result.kills), differences, result.attempts, bitwise))
        print(json.dumps({"run": name, "kills": [k.phase for k in result.kills], "differences": differences}))
        text = _section(rows, run_s=run_s, load=load, wall_s=time.monotonic() - t0, args=args)
        print(text)
        if args.write:  # after every run, so a long benchmark cut short keeps what it measured
            replace_section(text)


def _section(
    rows: list[tuple[int, list[Kill], list[str], int, bool]],
    *,
    run_s: float,
    load: float,
    wall_s: float,
    args: argparse.Namespace,
) -> str:
    phases = collections.Counter(k.phase for _, kills, _, _, _ in rows for k in kills)
    kills = sum(len(k) for _, k, _, _, _ in rows)
    orphans = sum(k.orphans for _, ks, _, _, _ in rows for k in ks)
    lines = [
        SECTION,
        "",
        f"`uv run python benchmarks/bench_kill_resume.py --runs {args.runs} --kills {args.kills} --seed {args.seed}"
        f"{'' if args.steps == 3 else f' --steps {args.steps}'}{' --reuse-straight' if args.reuse_straight else ''} --write` (load {load:.1f} at the start on the shared "
        f"2-core machine; {wall_s:.0f} s in all; the uninterrupted run took {run_s:.0f} s). Each run is killed with "
        "SIGKILL (the trainer alone, as the OOM killer does) at points drawn from the seed: a random time within "
        "an uninterrupted run's length, a random delay after an announced phase (a `training.log` event), or the "
        "moment a checkpoint's temporary directory appears; then `--resume`, until it finishes. Where each kill "
        "landed is read from what the run left (files, a torn line, its last log event); `collection or update` "
        "is not told apart.",
        "",
        "| phase the kill landed in | kills |",
        "|---|---|",
        *(f"| {phase} | {n} |" for phase, n in sorted(phases.items(), key=lambda x: (-x[1], x[0]))),
        f"| **all** | **{kills}** |",
        "",
        "| run | kills | attempts | equal to the uninterrupted run (metrics, episodes, summary, final weights) "
        "| bit for bit |",
        "|---|---|---|---|---|",
        *(
            f"| {i} | {len(k)} | {a} | {'equal' if not d else 'NOT equal: ' + '; '.join(d)[:300]} "
            f"| {'yes' if b else 'no'} |"
            for i, k, d, a, b in rows
        ),
        "",
        "`equal`: `run_differences(..., exact=False)`: tokens, messages, rewards, every metric but the sampler's "
        "batching counters and the mismatch metrics computed from its logprobs, the summary and the final "
        "weights' sha256 bit for bit; the sampler's logprobs within 1e-4 (which requests share a forward pass "
        'depends on their arrival times; see "reproducible sampling"). `bit for bit`: everything, exactly.',
        "Per kill (run: trigger -> phase):",
        "",
        *(f"- {i}: {k.trigger} -> {k.phase}" for i, ks, _, _, _ in rows for k in ks),
        "",
        f"MCP server processes still alive 10 s after their trainer was killed: {orphans}.",
    ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
