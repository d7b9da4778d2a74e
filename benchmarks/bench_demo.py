"""The demo (the default `cpu` profile), summarised: GRPO vs warm start vs the teacher vs continued SFT for the same wall-clock.

The runs themselves are ordinary CLI runs (their commands are recorded in the section this script writes):

    uv run mcprl-train --run-name demo-grpo                                   # the cpu profile
    uv run mcprl-train --run-name demo-sft --set run.steps=0 --set sft.steps=100000 \
        --set sft.max_time_s=<GRPO run's time to its final evaluation> --set sft.eval_every=<N>

This script reads both run directories, scores the imperfect teacher on the held-out validation tasks with
the tasks' own checker semantics (no model involved), prints the comparison and rewrites the
``## demo`` section of benchmarks/RESULTS.md.

    uv run python benchmarks/bench_demo.py outputs/demo-grpo outputs/demo-sft [--commands FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import time
from pathlib import Path
from typing import Any

import torch
import yaml
from results_md import replace_section

import mcprl_tasks
from mcprl_train.run.run_dir import RunDir

SECTION = "## demo"


def teacher_success(n_tasks: int | None = None, seed: int = 0) -> tuple[float, int]:
    """The imperfect teacher's success rate on the demo preset's validation tasks."""
    _, validation = mcprl_tasks.load_preset("demo")
    tasks = mcprl_tasks.read_tasks(validation)[:n_tasks]
    rng = random.Random(seed)
    ok = sum(mcprl_tasks.demo_succeeds(t, mcprl_tasks.imperfect_teacher(t, rng)) for t in tasks)
    return ok / len(tasks), len(tasks)


def curve(run: Path) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    records = RunDir.open(run).read_metrics().records
    evals = [r for r in records if r["kind"] == "eval"]
    summary = json.loads((run / "summary.json").read_text())
    return evals, summary


def model_name(run: Path) -> str:
    config = yaml.safe_load((run / "config.yaml").read_text())
    return str(config["model"]["name"])


def fmt(x: float | None) -> str:
    return "–" if x is None else f"{x:.3f}"


def section(grpo: Path, sft: Path, commands: str) -> str:
    g_evals, g_sum = curve(grpo)
    s_evals, s_sum = curve(sft)
    t_rate, t_n = teacher_success()
    g_last = [r["val/success_rate"] for r in g_evals if r.get("tag") in ("periodic", "final")][-3:]
    s_last = [r["val/success_rate"] for r in s_evals if r.get("tag") in ("sft", "warm_start")][-3:]
    g_mean = sum(g_last) / len(g_last)
    s_mean = sum(s_last) / len(s_last)
    n_val = g_sum["val_tasks"]
    lines = [
        SECTION,
        "",
        f"The default run (`uv run mcprl-train`, profile `cpu`): the embedded `{model_name(grpo)}` Qwen3 (see",
        "`mcprl_policy.TINY_PRESETS`), three real offline MCP servers over stdio (finance, calculator, messaging), the",
        "`demo` task preset (quote, quote_mul, quote_ratio, post_quote; 1-3 tool calls), a warm start on 800",
        "demonstrations of the imperfect teacher, then GRPO (32 tasks x 8 episodes per step). Validation is greedy",
        f"on {n_val} held-out tasks; 'last-3 mean' averages the last three evaluations ({3 * n_val} episodes).",
        "",
        f"- date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}",
        f"- machine: {platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__} "
        f"({torch.get_num_threads()} threads), Python {platform.python_version()}, load average at the end "
        f"{os.getloadavg()[0]:.1f} (shared machine)",
        "- commands:",
        "",
        "```",
        commands.strip(),
        "```",
        "",
        "| | success rate | reward | wall-clock (s) |",
        "|---|---:|---:|---:|",
        f"| imperfect teacher (its own demos on {t_n} validation tasks) | {t_rate:.3f} | – | – |",
        f"| after warm start (SFT {g_sum['sft_steps']} steps) | {fmt(g_sum['success_warm_start'])} | "
        f"{fmt(g_sum['reward_warm_start'])} | – |",
        f"| after GRPO ({g_sum['steps']} steps), final evaluation | {fmt(g_sum['success_final'])} | "
        f"{fmt(g_sum['reward_final'])} | {g_sum['elapsed_s']:.0f} |",
        f"| after GRPO, last-3 mean | {g_mean:.3f} | – | – |",
        f"| continued SFT for the same wall-clock ({s_sum['sft_steps']} steps), last-3 mean | {s_mean:.3f} | "
        f"{fmt(s_sum['reward_warm_start'])} | {s_sum['elapsed_s']:.0f} |",
        "",
        "Validation curves (success rate by wall-clock):",
        "",
        "| run | tag | step | elapsed (s) | success | reward |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for name, evals in (("GRPO", g_evals), ("continued SFT", s_evals)):
        for r in evals:
            step = r["step"] if r.get("tag") not in ("sft", "warm_start") else f"sft {r['sft_step']}"
            lines.append(
                f"| {name} | {r.get('tag')} | {step} | {r.get('time/elapsed_s', 0):.0f} | "
                f"{r['val/success_rate']:.3f} | {r['val/reward_mean']:.3f} |"
            )
    lines += [
        "",
        f"demo_grpo_minus_teacher: {g_mean - t_rate:+.3f} (bar ≥ +0.05)",
        f"demo_grpo_minus_continued_sft: {g_mean - s_mean:+.3f} (bar ≥ +0.05)",
        f"demo_warm_start_success: {fmt(g_sum['success_warm_start'])} (bar ≤ 0.5)",
        f"demo_grpo_success: {g_mean:.3f} (bar ≥ 0.85, goal 0.9)",
        f"demo_wall_clock_s: {g_sum['elapsed_s']:.0f} (bar ≤ 900, goal 600)",
        "",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("grpo_run", type=Path)
    parser.add_argument("sft_run", type=Path)
    parser.add_argument(
        "--commands", type=Path, default=None, help="file with the exact commands of both runs"
    )
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    commands = args.commands.read_text() if args.commands else "(see the run directories' config.yaml)"
    text = section(args.grpo_run, args.sft_run, commands)
    print(text)
    if not args.no_write:
        replace_section(text)


if __name__ == "__main__":
    main()
