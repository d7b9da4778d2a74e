"""Benchmark: the SFT warm start in fp32 against bf16-mixed on the cpu profile's tiny model.

Runs ``mcprl-train`` in-process for ``--steps`` SFT steps (no GRPO, no validation) once per precision and
repetition, alternating the two, and prints one JSON line per run: each step's thread CPU time (torch limited to
one thread, so the calling thread does all the arithmetic: the time is not inflated by other processes on a
loaded machine) and the ``sft/loss`` curve.

    uv run python benchmarks/bench_precision.py [--steps 30] [--reps 2] [--out /tmp/bench-precision]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from mcprl_train.cli import main
from mcprl_train.loop import warm_start


def run(dtype: str, rep: int, steps: int, out: Path) -> dict[str, Any]:
    times: list[float] = []
    original = warm_start.SFTStage.train_step

    def timed(self: warm_start.SFTStage) -> dict[str, float]:
        start = time.thread_time()
        metrics = original(self)
        times.append(time.thread_time() - start)
        return metrics

    warm_start.SFTStage.train_step = timed  # pyright: ignore[reportAttributeAccessIssue]
    try:
        name = f"sft-{dtype}-{rep}"
        code = main(
            [
                "train",
                "--run-name",
                name,
                *("--set", f"run.output_dir={out}"),
                *("--set", f"model.dtype={dtype}"),
                *("--set", f"sft.steps={steps}"),
                *("--set", "run.steps=0"),
                *("--set", "tasks.validation=null"),
                *("--set", "tracking.progress=false"),
            ]
        )
    finally:
        warm_start.SFTStage.train_step = original
    lines = [json.loads(line) for line in (out / name / "metrics.jsonl").read_text().splitlines()]
    losses = [m["sft/loss"] for m in lines if "sft/loss" in m]
    return {
        "dtype": dtype,
        "rep": rep,
        "exit": code,
        "step_cpu_s_median": statistics.median(times),
        "step_cpu_s": times,
        "loss": losses,
    }


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="SFT step CPU time and loss: fp32 vs bf16-mixed")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--out", type=Path, default=Path("/tmp/bench-precision"))
    return parser.parse_args()


if __name__ == "__main__":
    args = parse()
    torch.set_num_threads(1)
    for rep in range(1, args.reps + 1):
        for dtype in ("float32", "bfloat16"):
            print(json.dumps(run(dtype, rep, args.steps, args.out)), flush=True)
