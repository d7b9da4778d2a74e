"""Decode attention row by row against one masked call: a checkpoint's greedy multi-turn evaluation, both ways.

`mcprl_policy.attention.decode_sdpa` splits a decode step's attention into one call per row when the shared
window is long and mostly masked on the left (episodes at different turns: the longest row sets the window).
This runs ``mcprl-train eval --checkpoint DIR`` in-process on ``--tasks`` validation tasks, alternating the
two sides ``--repeats`` times: "one call" raises `PER_ROW_MIN_WINDOW` out of reach, "row by row" is the
shipped setting. Each run's wall-clock and process CPU time (the decode thread and the event loop; the MCP
servers are other processes) are printed with its success rate; the headline is the best CPU time of "one
call" over the best of "row by row".

    uv run python benchmarks/bench_decode_rows.py --checkpoint outputs/RUN [--tasks 22] [--repeats 2]

Writes one ``checkpoint_eval`` record per run into the checkpoint's run directory (as ``mcprl-train eval``
does). On a shared machine run it with ``OMP_NUM_THREADS=1`` and say the load (printed).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import torch

from mcprl_policy import attention
from mcprl_train.commands.evaluate import evaluate_checkpoint

SHIPPED = attention.PER_ROW_MIN_WINDOW


def run_eval(checkpoint: Path, tasks: int, *, per_row: bool) -> dict[str, Any]:
    setattr(attention, "PER_ROW_MIN_WINDOW", SHIPPED if per_row else 1 << 30)  # noqa: B010
    try:
        wall, cpu = time.perf_counter(), time.process_time()
        summary = anyio.run(evaluate_checkpoint, checkpoint, [f"eval.n_tasks={tasks}"])
        return {
            "wall_s": time.perf_counter() - wall,
            "cpu_s": time.process_time() - cpu,
            "success": summary.get("val/success_rate"),
            "turns": summary.get("val/turns_mean"),
        }
    finally:
        setattr(attention, "PER_ROW_MIN_WINDOW", SHIPPED)  # noqa: B010


def run_side(checkpoint: Path, tasks: int, *, per_row: bool) -> dict[str, Any]:
    """`run_eval` in a process of its own: each evaluation starts from the same empty heap."""
    args = [sys.executable, __file__, "--checkpoint", str(checkpoint), "--tasks", str(tasks), "--one"]
    done = subprocess.run([*args, "row" if per_row else "call"], capture_output=True, text=True, check=True)
    return json.loads(done.stdout.splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(
        description="greedy evaluation with decode attention row by row vs one call"
    )
    parser.add_argument("--checkpoint", type=Path, required=True, help="a checkpoint or run directory")
    parser.add_argument("--tasks", type=int, default=22, help="validation tasks per evaluation")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--one", choices=["row", "call"], default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one is not None:
        print(json.dumps(run_eval(args.checkpoint, args.tasks, per_row=args.one == "row")))
        return
    print(f"torch threads {torch.get_num_threads()}, load average before {os.getloadavg()}", flush=True)
    best: dict[str, float] = {}
    for rep in range(args.repeats):
        for per_row in (False, True):
            side = "row by row" if per_row else "one call"
            result = run_side(args.checkpoint, args.tasks, per_row=per_row)
            best[side] = min(best.get(side, float("inf")), result["cpu_s"])
            print(f"rep {rep} {side:10s} " + " ".join(f"{k}={v:.3f}" for k, v in result.items()), flush=True)
    print(f"load average after {os.getloadavg()}")
    print(f"decode_rows_eval_speedup: {best['one call'] / best['row by row']:.2f}")


if __name__ == "__main__":
    main()
