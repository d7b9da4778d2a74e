"""Benchmark: the warm start's SFT step, by thread CPU time, with its loss and token-accuracy curve.

Runs ``mcprl-train`` in-process (the cpu profile unless ``--set`` says otherwise) for ``--steps`` SFT steps with
no GRPO, once per variant, alternating the variants ``--reps`` times, and prints one JSON line per run: each
SFT step's thread CPU time (torch on one thread, so the calling thread does all the arithmetic and the time is
not inflated by other processes on a loaded machine), ``sft/loss`` and ``sft/token_acc`` at every step, and the
held-out evaluations the run made (``sft.eval_every``). ``--profile`` prints torch.profiler's table of the
operators of steps 5-7 of each run.

    uv run python benchmarks/bench_warm_start.py --variant rl=rl: --variant new= --steps 30
    uv run python benchmarks/bench_warm_start.py --train-profile cpu-smollm2 --steps 3 --reps 2 \
        --variant packed=sft.layout=packed --variant grouped=sft.layout=prefix_grouped
    # a variant is NAME=[rl:]KEY=VALUE[,KEY=VALUE...]: extra `--set`s for that run; `rl:` runs the step on the
    # RL forward (`policy_forward`: every position through the output head, entropies, the logits recomputed in
    # backward) instead of `target_logprobs`, as the comparison
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from pathlib import Path
from typing import Any

import structlog
import torch
from torch.profiler import ProfilerActivity, profile

from mcprl_policy import policy_forward
from mcprl_train.cli import main
from mcprl_train.loop import warm_start
from mcprl_train.loop.samples import pack_indices, without_first_token


def rl_forward_step(self: warm_start.SFTStage) -> dict[str, float]:
    """`SFTStage.train_step` with the loss on the RL forward's per-token logprobs, masked to the targets."""
    batch = self.next_batch()
    total = max(1, sum(e.num_targets for e in batch))
    self.optimizer.zero_grad(set_to_none=True)
    loss_sum = correct = 0.0
    for b in pack_indices([len(e.token_ids) for e in batch], self.optim.micro_batch_tokens):
        items = [batch[i] for i in b]
        with self.policy.autocast():
            out = policy_forward(
                self.policy, [e.token_ids for e in items], temperature=1.0, values=False, layout=self.layout
            )
        mask = torch.cat(
            [without_first_token(torch.tensor(e.assistant_mask, dtype=torch.float32)) for e in items]
        )
        lp = out.logprobs.float()
        loss = -(lp * mask).sum() / total
        torch.autograd.backward(loss)
        loss_sum += float(loss.detach()) * total
        correct += float(((lp > math.log(0.5)).float() * mask).sum())
    norm = float(
        torch.nn.utils.clip_grad_norm_(
            [p for g in self.optimizer.param_groups for p in g["params"]], self.config.max_grad_norm
        )
    )
    self.optimizer.step()
    self.scheduler.step()
    self.step += 1
    return {
        "sft/loss": loss_sum / total,
        "sft/token_acc": correct / total,
        "sft/grad_norm": norm,
        "sft/lr": float(self.optimizer.param_groups[0]["lr"]),
        "sft/epoch": float(self.epoch),
        "sft/tokens": float(total),
    }


def run(
    name: str,
    sets: list[str],
    steps: int,
    out: Path,
    common: list[str],
    profiled: bool,
    rl: bool,
    train_profile: str,
) -> dict[str, Any]:
    times: list[float] = []
    restore = warm_start.SFTStage.train_step
    original = rl_forward_step if rl else restore
    prof = profile(activities=[ProfilerActivity.CPU]) if profiled else None

    def timed(self: warm_start.SFTStage) -> dict[str, float]:
        if prof is not None and len(times) == 4:
            prof.__enter__()
        start = time.thread_time()
        metrics = original(self)
        times.append(time.thread_time() - start)
        if prof is not None and len(times) == 7:
            prof.__exit__(None, None, None)
        return metrics

    warm_start.SFTStage.train_step = timed  # pyright: ignore[reportAttributeAccessIssue]
    start = time.perf_counter()
    try:
        code = main(
            [
                "train",
                *("--profile", train_profile),
                "--run-name",
                name,
                *("--set", f"run.output_dir={out}"),
                *("--set", f"sft.steps={steps}"),
                *("--set", "run.steps=0"),
                *("--set", "tracking.progress=false"),
                *[arg for kv in [*common, *sets] for arg in ("--set", kv)],
            ]
        )
    finally:
        warm_start.SFTStage.train_step = restore
        structlog.reset_defaults()
    wall = time.perf_counter() - start
    if prof is not None:
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25), flush=True)
    lines = [json.loads(line) for line in (out / name / "metrics.jsonl").read_text().splitlines()]
    sft = [m for m in lines if "sft/loss" in m]
    evals = [
        {k: m[k] for k in m if k.startswith(("eval", "val", "time/elapsed")) or k == "sft_step"}
        for m in lines
        if any(k.startswith("val") for k in m)
    ]
    return {
        "name": name,
        "exit": code,
        "wall_s": wall,
        "step_cpu_s_median": statistics.median(times),
        "step_cpu_s_sum": sum(times),
        "loss": [round(m["sft/loss"], 6) for m in sft],
        "token_acc": [round(m["sft/token_acc"], 4) for m in sft],
        "evals": evals,
        "step_cpu_s": [round(t, 4) for t in times],
    }


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="SFT step CPU time, loss and accuracy per variant")
    parser.add_argument("--variant", action="append", required=True, help="NAME=KEY=VALUE[,KEY=VALUE...]")
    parser.add_argument("--set", action="append", default=[], dest="common", help="a --set for every run")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--reps", type=int, default=1)
    parser.add_argument("--profile", action="store_true", help="print torch.profiler's table of steps 5-7")
    parser.add_argument("--train-profile", default="cpu", help="the shipped profile the runs start from")
    parser.add_argument("--out", type=Path, default=Path("/tmp/bench-warm-start"))
    return parser.parse_args()


if __name__ == "__main__":
    args = parse()
    torch.set_num_threads(1)
    best: dict[str, float] = {}
    for rep in range(1, args.reps + 1):
        for variant in args.variant:
            name, _, rest = variant.partition("=")
            rl = rest.startswith("rl:")
            sets = [s for s in rest.removeprefix("rl:").split(",") if s]
            result = run(
                f"{name}-{rep}", sets, args.steps, args.out, args.common, args.profile, rl, args.train_profile
            )
            print(json.dumps(result), flush=True)
            best[name] = min(best.get(name, math.inf), result["step_cpu_s_median"])
    baseline, *others = best
    for name in others:
        # the baseline's median SFT step CPU time over this variant's, best run of each
        print(f"sft_step_speedup[{name} vs {baseline}]: {best[baseline] / best[name]:.2f}")
