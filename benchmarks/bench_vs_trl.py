"""mcprl against TRL's ``GRPOTrainer`` on the same work: model, tasks, MCP servers, reward, group size, episodes per step, lr.

Both sides start from the same warm-started checkpoint (``uv run mcprl-train --set run.steps=0`` makes one)
and run N GRPO steps one after the other, in one invocation:

- **mcprl**: ``mcprl-train`` (the ``cpu`` profile) with ``model.name`` set to the checkpoint's policy, no
  warm start, its own evaluation every ``--eval-every`` steps; each ``Trainer.grpo_step`` is timed from
  outside (wall-clock and process CPU time).
- **TRL**: ``benchmarks/trl_grpo.py`` in TRL's interpreter (``TRL_PYTHON``, default ``/tmp/trlenv/bin/python``;
  that file's docstring says how to make it and what of TRL runs: its tool-calling loop, the MCP tools
  wrapped as the Python functions it calls, mcprl's reward), with the ``GRPOConfig`` in ``grpo_config``.
  It saves the weights every ``--eval-every`` steps and this script evaluates them with mcprl's evaluator
  (``mcprl_train.loop.evaluation.evaluate_tasks``: greedy, the same held-out tasks, the same servers), so the
  two curves are measured by one ruler.

It prints per-step wall-clock and CPU time of both, held-out success against cumulative training time, and
``mcprl_vs_trl_speedup: X`` = TRL's training time to the highest success rate both sides reach ÷ mcprl's
(wall-clock; the CPU-time ratio on the next line). When neither side improves on the starting success rate
there is no such rate: the headline is ``nan`` and the reason is printed. Evaluation and checkpoint time is
excluded on both sides.

    uv run python benchmarks/bench_vs_trl.py --warm outputs/<warm-run> [--quick] [--write-results]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import attrs

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
SECTION = "## bench_vs_trl"
DEMO_TRAIN = ROOT / "apps/mcprl-tasks/src/mcprl_tasks/data/demo/train.json"


@attrs.frozen(kw_only=True)
class Point:
    """One evaluation: after ``step`` steps and that much training time."""

    step: int
    wall_s: float
    cpu_s: float
    success: float


@attrs.frozen(kw_only=True)
class Side:
    name: str
    step_wall_s: list[float]
    step_cpu_s: list[float]
    step_tokens: list[float]
    curve: list[Point]

    def time_to(self, success: float) -> tuple[float, float] | None:
        """Training (wall, CPU) seconds at the first evaluation reaching ``success``."""
        return next(((p.wall_s, p.cpu_s) for p in self.curve if p.success >= success - 1e-9), None)


def trl_python() -> str:
    """TRL's interpreter, or a clear exit saying how to make one."""
    python = os.environ.get("TRL_PYTHON", "/tmp/trlenv/bin/python")
    probe = [python, "-c", "import trl, mcp, mcprl_tasks, mcprl_env"]
    if not Path(python).exists() or subprocess.run(probe, capture_output=True).returncode != 0:
        raise SystemExit(
            f"TRL's side does not import with {python} (it needs trl, mcp and the workspace's task packages). "
            "Make a throwaway environment beside the workspace:\n"
            "  python -m venv /tmp/trlenv && /tmp/trlenv/bin/pip install trl==1.16.0 transformers==5.19.0 mcp "
            "structlog tenacity bm25s attrs\n"
            "  /tmp/trlenv/bin/pip install --no-deps -e packages/mcprl-env -e packages/mcprl-tools "
            "-e apps/mcprl-servers -e apps/mcprl-tasks\n"
            "or point TRL_PYTHON at another interpreter that has them."
        )
    return python


def cumulative(xs: list[float], upto: int) -> float:
    return sum(xs[:upto])


def run_mcprl(args: argparse.Namespace, policy: Path, out: Path) -> Side:
    """mcprl-train in a child process, each GRPO step timed by `_timed_main`."""
    run_dir = out / "mcprl"
    overrides = {
        "model.name": str(policy),
        "sft.enabled": "false",
        "run.steps": str(args.steps),
        "grpo.tasks_per_step": str(args.tasks_per_step),
        "grpo.group_size": str(args.group_size),
        "optim.lr": str(args.lr),
        "eval.every": str(args.eval_every),
        "eval.n_tasks": str(args.eval_tasks),
        "run.checkpoint_every": "0",
        "run.output_dir": str(out),
    }
    cli = ["train", "--run-name", "mcprl"] + [a for k, v in overrides.items() for a in ("--set", f"{k}={v}")]
    steps_file = out / "mcprl-steps.jsonl"
    steps_file.unlink(missing_ok=True)
    cmd = [sys.executable, str(Path(__file__)), "_mcprl-side", str(steps_file), *cli]
    subprocess.run(cmd, check=True, cwd=ROOT)
    steps = [json.loads(line) for line in steps_file.read_text().splitlines()]
    wall = [s["wall_s"] for s in steps]
    cpu = [s["cpu_s"] for s in steps]
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in records if r["kind"] == "eval"]
    tokens = [
        r["rollout/sampled_tokens_mean"] * r["rollout/episodes"] for r in records if r["kind"] == "grpo"
    ]
    curve = [
        Point(
            step=r["step"],
            wall_s=cumulative(wall, r["step"]),
            cpu_s=cumulative(cpu, r["step"]),
            success=r["val/success_rate"],
        )
        for r in evals
    ]
    return Side(name="mcprl", step_wall_s=wall, step_cpu_s=cpu, step_tokens=tokens, curve=curve)


def _timed_main(steps_file: Path, cli: list[str]) -> int:
    """``mcprl-train`` with each ``Trainer.grpo_step`` timed (wall-clock, process CPU) into ``steps_file``."""
    from mcprl_train import cli as train_cli
    from mcprl_train.loop.trainer import Trainer

    step = Trainer.grpo_step

    async def timed(self: Trainer) -> dict[str, float]:
        wall, cpu = time.perf_counter(), time.process_time()
        metrics = await step(self)
        row = {"wall_s": time.perf_counter() - wall, "cpu_s": time.process_time() - cpu}
        with steps_file.open("a") as f:
            f.write(json.dumps(row) + "\n")
        return metrics

    Trainer.grpo_step = timed  # type: ignore[method-assign]
    return train_cli.main(cli)


def run_trl(args: argparse.Namespace, policy: Path, out: Path) -> Path:
    target = out / "trl"
    cmd = [
        trl_python(),
        str(BENCH / "trl_grpo.py"),
        "--model", str(policy),
        "--tasks", str(DEMO_TRAIN),
        "--out", str(target),
        "--steps", str(args.steps),
        "--tasks-per-step", str(args.tasks_per_step),
        "--group-size", str(args.group_size),
        "--lr", str(args.lr),
        "--save-every", str(args.eval_every),
        "--max-completion-length", str(args.trl_max_completion_length),
        "--max-tool-iterations", str(args.trl_max_tool_iterations),
    ]  # fmt: skip
    env = {**os.environ, "TRL_EXPERIMENTAL_SILENCE": "1"}
    subprocess.run(cmd, check=True, cwd=ROOT, env=env)
    return target


async def evaluate_dirs(config_run: Path, models: list[Path]) -> list[float]:
    """Success rate of each model directory with mcprl's evaluator and the mcprl run's eval settings."""
    from mcprl_env import Environment
    from mcprl_train import build
    from mcprl_train.cassettes import tool_manager
    from mcprl_train.loop.evaluation import evaluate_tasks
    from mcprl_train.run.run_dir import RunDir

    run_dir = RunDir.open(config_run)
    config = run_dir.load_config()
    assert config.tasks.validation is not None
    tasks = build.validation_tasks(config, checker=build.default_checker(config))
    rates = []
    async with tool_manager(config, run_dir.path) as manager:
        for model in models:
            policy = build.build_policy(config, source=str(model))
            policy.eval()
            sampler = build.build_sampler(config, policy, greedy=config.eval.greedy, seed=config.run.seed)
            env = Environment(manager=manager, tokenizer=policy.tokenizer, config=config.env)
            metrics, _ = await evaluate_tasks(
                env,
                tasks,
                sampler,
                max_concurrent_episodes=config.collection.max_concurrent_episodes,
                namespace=f"trl-{model.name}",
            )
            rates.append(metrics["val/success_rate"])
    return rates


def trl_side(target: Path, mcprl_run: Path, start: Point, episodes: int) -> Side:
    import anyio

    steps = [json.loads(line) for line in (target / "steps.jsonl").read_text().splitlines()]
    wall = [s["wall_s"] for s in steps]
    cpu = [s["cpu_s"] for s in steps]
    history = json.loads((target / "log_history.json").read_text())
    # completions/mean_length counts the model's tokens only (TRL's tool_mask leaves the tool results out).
    tokens = [h["completions/mean_length"] * episodes for h in history if "completions/mean_length" in h]
    saved = sorted((p for p in target.glob("step-*") if p.is_dir()), key=lambda p: int(p.name.split("-")[1]))
    rates = anyio.run(evaluate_dirs, mcprl_run, saved)
    curve = [start] + [
        Point(
            step=(n := int(p.name.split("-")[1])),
            wall_s=cumulative(wall, n),
            cpu_s=cumulative(cpu, n),
            success=r,
        )
        for p, r in zip(saved, rates, strict=True)
    ]
    return Side(name="TRL", step_wall_s=wall, step_cpu_s=cpu, step_tokens=tokens, curve=curve)


def speedup(mcprl: Side, trl: Side) -> tuple[float, float, float | None, str]:
    """(wall ratio, CPU ratio, the success rate both reach, why nan) of TRL's time to it over mcprl's."""
    start = mcprl.curve[0].success
    both = min(max(p.success for p in mcprl.curve[1:]), max(p.success for p in trl.curve[1:]))
    if both <= start + 1e-9:
        why = (
            f"the lower of the two sides' best evaluations after step 0 does not beat the start ({start:.3f})"
        )
        return math.nan, math.nan, None, why
    m, t = mcprl.time_to(both), trl.time_to(both)
    assert m is not None
    assert t is not None
    return t[0] / m[0], t[1] / m[1], both, ""


def median(xs: list[float]) -> float:
    s = sorted(xs)
    return s[len(s) // 2] if len(s) % 2 else (s[len(s) // 2 - 1] + s[len(s) // 2]) / 2


def report(
    mcprl: Side, trl: Side, args: argparse.Namespace, command: str, load: tuple[float, ...], sft_steps: int
) -> list[str]:
    wall, cpu, both, why = speedup(mcprl, trl)
    lines = [
        SECTION,
        "",
        "mcprl and TRL's `GRPOTrainer` on the demo from the same warm-started checkpoint: same model, tasks (the",
        "`demo` preset), MCP servers (finance, calculator, messaging over stdio), reward (mcprl's default weights,",
        "demo checker), group size, episodes per step and lr; evaluation by mcprl's evaluator on the same held-out",
        "tasks (greedy). What TRL does differently is in `benchmarks/trl_grpo.py`'s docstring and `grpo_config`.",
        "TRL's loop ends a rollout at the first turn without a parsed tool call, and it has one completion budget",
        "(every turn and tool result together) and one tool-iteration limit for all tasks; mcprl answers a malformed",
        "call with an error turn (up to 3 in a row) and caps each turn and the episode. A weak policy therefore",
        "samples fewer tokens per episode under TRL: 'CPU ms per sampled token' compares the same unit.",
        "",
        f"- date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; machine: {platform.machine()}, "
        f"{os.cpu_count()} cores, load average {load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f} (shared)",
        f"- command: `{command}`",
        f"- warm start: `{args.warm}`, {sft_steps} SFT steps (`uv run mcprl-train --set run.steps=0`)",
        f"- setup: {args.steps} steps x {args.tasks_per_step} tasks x {args.group_size} episodes, lr {args.lr}, "
        f"evaluation on {args.eval_tasks} tasks every {args.eval_every} steps",
        "",
        "| side | step wall s (median) | step CPU s (median) | sampled tokens per step | CPU ms per sampled token |",
        "|---|---|---|---|---|",
    ]
    for side in (mcprl, trl):
        per_token = 1000 * sum(side.step_cpu_s) / sum(side.step_tokens)
        lines.append(
            f"| {side.name} | {median(side.step_wall_s):.1f} | {median(side.step_cpu_s):.1f} | "
            f"{median(side.step_tokens):.0f} | {per_token:.1f} |"
        )
    lines += [
        "",
        "| side | step | training wall s | training CPU s | held-out success |",
        "|---|---|---|---|---|",
    ]
    for side in (mcprl, trl):
        lines += [
            f"| {side.name} | {p.step} | {p.wall_s:.1f} | {p.cpu_s:.1f} | {p.success:.3f} |"
            for p in side.curve
        ]
    step_cpu = median(trl.step_cpu_s) / median(mcprl.step_cpu_s)
    step_wall = median(trl.step_wall_s) / median(mcprl.step_wall_s)
    lines += [
        "",
        f"Per step, TRL takes {step_wall:.2f}x mcprl's wall-clock and {step_cpu:.2f}x its CPU time.",
        "",
        f"mcprl_vs_trl_speedup: {wall:.2f}",
        f"mcprl_vs_trl_speedup_cpu: {cpu:.2f}",
        f"mcprl_vs_trl_step_cpu_ratio: {step_cpu:.2f}",
    ]
    if both is None:
        lines.append(f"(no success rate both reach: {why})")
    else:
        lines.append(f"(the success rate both reach: {both:.3f})")
    return lines


def main(argv: list[str] | None = None) -> int:
    raw = sys.argv[1:] if argv is None else argv
    if raw and raw[0] == "_mcprl-side":
        return _timed_main(Path(raw[1]), raw[2:])
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--warm", type=Path, required=True, help="a warm-started checkpoint or run directory")
    parser.add_argument("--out", type=Path, default=Path("outputs/bench_vs_trl"))
    parser.add_argument("--quick", action="store_true", help="2 steps x 4 tasks x 8, evaluation on 24 tasks")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--tasks-per-step", type=int, default=32)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--lr", type=float, default=3e-4)
    parser.add_argument("--eval-every", type=int, default=5)
    parser.add_argument("--eval-tasks", type=int, default=100)
    parser.add_argument("--trl-max-completion-length", type=int, default=512)
    parser.add_argument("--trl-max-tool-iterations", type=int, default=4)
    parser.add_argument("--write-results", action="store_true", help="rewrite this section of RESULTS.md")
    args = parser.parse_args(raw)
    if args.quick:
        args.steps, args.tasks_per_step, args.eval_every, args.eval_tasks = 2, 4, 2, 24
    if args.steps % args.eval_every:
        parser.error(f"--steps ({args.steps}) must be a multiple of --eval-every ({args.eval_every})")

    from mcprl_train.run.run_dir import open_checkpoint

    _, warm = open_checkpoint(args.warm)
    policy = warm.subdir("policy")
    trl_python()  # fail before the mcprl side runs
    args.out.mkdir(parents=True, exist_ok=True)
    command = "uv run python benchmarks/bench_vs_trl.py " + " ".join(raw)
    mcprl = run_mcprl(args, policy, args.out)
    target = run_trl(args, policy, args.out)
    trl = trl_side(target, args.out / "mcprl", mcprl.curve[0], args.tasks_per_step * args.group_size)
    lines = report(mcprl, trl, args, command, os.getloadavg(), int(warm.meta["state"]["sft_step"]))
    print("\n".join(lines))
    if args.write_results:
        from results_md import replace_section

        replace_section("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
