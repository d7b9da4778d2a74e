"""Rollout/learn overlap (``collection.overlap``) against the plain collect → learn loop on the demo.

Both sides start from the same warm-started policy (a checkpoint of ``uv run mcprl-train --set run.steps=0``),
run the cpu profile's GRPO steps (32 tasks x 8 episodes, the three offline MCP servers over stdio) with the same
seed, and evaluate greedily on held-out tasks every ``--eval-every`` steps. The sides alternate (off, on, on,
off, ...) so that a change of load hits both; each run is a fresh process (``mcprl-train``), so its CPU time is
its own plus its tool servers'. Per run: the GRPO steps' wall-clock (`perf/step_s`, evaluations excluded), the
process tree's CPU time, and the held-out success curve.

    uv run python benchmarks/bench_overlap.py --checkpoint outputs/warm [--steps 10] [--repeats 3]

Prints ``overlap_step_speedup: X`` (best-of-repeats mean step wall-clock, off ÷ on) on its own line.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from mcprl_train.run.run_dir import RunDir, open_checkpoint


def children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def one_run(args: argparse.Namespace, policy_dir: str, out: Path, name: str, overlap: bool) -> dict[str, Any]:
    """One ``mcprl-train`` run of one side; its step wall-clocks, CPU time and curve."""
    sets = [
        f"model.name={policy_dir}",
        "sft.enabled=false",
        f"run.steps={args.steps}",
        f"run.seed={args.seed}",
        "run.checkpoint_every=0",
        f"eval.every={args.eval_every}",
        f"eval.n_tasks={args.eval_tasks}",
        f"run.output_dir={out}",
        f"run.name={name}",
        "tracking.progress=false",
        f"collection.overlap={str(overlap).lower()}",
        *args.set,
    ]
    command = [sys.executable, "-m", "mcprl_train", "train", "--profile", "cpu"]
    command += [x for s in sets for x in ("--set", s)]
    cpu0, load0, t0 = children_cpu_s(), os.getloadavg()[0], time.perf_counter()
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wall, cpu = time.perf_counter() - t0, children_cpu_s() - cpu0
    records = RunDir.open(out / name).read_metrics().records
    steps = [r for r in records if r["kind"] == "grpo"]
    evals = [r for r in records if r["kind"] == "eval"]
    step_s = [float(r["perf/step_s"]) for r in steps]
    return {
        "overlap": overlap,
        "step_s": step_s,
        "mean_step_s": statistics.fmean(step_s),
        "grpo_s": sum(step_s),
        "collect_s": statistics.fmean(float(r["perf/collect_s"]) for r in steps),
        "learn_s": statistics.fmean(float(r["perf/learn_s"]) for r in steps),
        "lag": [float(r.get("rollout/policy_lag", 0.0)) for r in steps],
        "curve": [(int(r["step"]), float(r["val/success_rate"]), float(r["val/reward_mean"])) for r in evals],
        "train_success": statistics.fmean(float(r["rollout/success_rate"]) for r in steps),
        "process_wall_s": wall,
        "process_cpu_s": cpu,
        "load": (load0, os.getloadavg()[0]),
    }


def line(run: dict[str, Any]) -> str:
    curve = " ".join(f"{s}:{v:.3f}/{w:.3f}" for s, v, w in run["curve"])
    return (
        f"| {'on' if run['overlap'] else 'off'} | {run['mean_step_s']:.2f} | {run['collect_s']:.2f} | "
        f"{run['learn_s']:.2f} | {run['grpo_s']:.1f} | {run['process_cpu_s']:.1f} | {run['process_wall_s']:.1f} | "
        f"{curve} | {run['train_success']:.3f} | {run['load'][0]:.1f}-{run['load'][1]:.1f} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description="Rollout/learn overlap against the plain loop on the demo.")
    parser.add_argument("--checkpoint", type=Path, required=True, help="a warm-started run or checkpoint")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--eval-every", type=int, default=5)
    parser.add_argument("--eval-tasks", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--set", action="append", default=[], help="more config overrides, both sides")
    args = parser.parse_args()
    if args.steps < 2 or args.repeats < 1:
        parser.error("--steps must be >= 2 (overlap starts at the second step) and --repeats >= 1")
    _, loaded = open_checkpoint(args.checkpoint)
    policy_dir = str(loaded.subdir("policy"))
    runs: list[dict[str, Any]] = []
    print(
        "| overlap | mean step (s) | collect (s) | learn (s) | GRPO steps (s) | CPU, process tree (s) | "
        "process wall (s) | held-out (step:success/reward) | train success | load |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---|---:|---|")
    with tempfile.TemporaryDirectory(prefix="bench-overlap-") as tmp:
        for r in range(args.repeats):
            order = (False, True) if r % 2 == 0 else (True, False)
            for overlap in order:
                run = one_run(args, policy_dir, Path(tmp), f"r{r}-{'on' if overlap else 'off'}", overlap)
                runs.append(run)
                print(line(run), flush=True)
    best = {side: min(x["mean_step_s"] for x in runs if x["overlap"] == side) for side in (False, True)}
    cpu = {side: min(x["process_cpu_s"] for x in runs if x["overlap"] == side) for side in (False, True)}
    print(f"best mean step: off {best[False]:.2f} s, on {best[True]:.2f} s")
    print(f"least process-tree CPU: off {cpu[False]:.1f} s, on {cpu[True]:.1f} s")
    print(f"overlap_step_speedup: {best[False] / best[True]:.3f}")


if __name__ == "__main__":
    main()
