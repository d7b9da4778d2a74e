"""The update's forward + backward on real GRPO steps: the ``padded`` layout against ``prefix_grouped``.

Reads a run's ``trajectories.jsonl`` and, for each chosen GRPO step, takes the episodes the learner trains on
(valid, with an action token, from groups whose rewards differ: ``grpo.filter_zero_std``), packs them as the
learner does for each layout (``optim.micro_batch_tokens``: `pack_indices` for padded, `pack_prefix_groups` for
prefix_grouped) and runs every micro-batch's forward and backward (the action tokens scored, as the learner's
``needed`` mask asks) on the run's own policy. The two layouts alternate, best of ``--repeats`` each, by the
process's CPU time; the logprobs of both are compared (same function of the weights: float rounding only).

    uv run python benchmarks/bench_layouts.py outputs/RUN [--steps 1,25,50] [--repeats 3] [--threads 1]

Prints ``prefix_grouped_vs_padded_speedup: X`` (padded CPU ÷ prefix_grouped CPU, summed over the steps).

With ``--reference`` it times the KL reference's forward instead (no autograd; `mcprl_policy.ReferencePolicy`,
a frozen copy of the run's policy) over the prefix-grouped micro-batches: packed with every token scored (how
the reference ran before it followed the learner's layout) against ``prefix_grouped`` with only the action
tokens scored (the learner's ``needed`` mask), and prints ``reference_grouped_vs_packed_speedup: X``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import torch

from mcprl_policy import Policy, ReferencePolicy, policy_forward
from mcprl_policy.prefix_grouped import pack_prefix_groups
from mcprl_train.loop.samples import pack_indices
from mcprl_train.run.run_dir import open_checkpoint


def trained_episodes(path: Path, step: int) -> list[dict[str, Any]]:
    """Step ``step``'s episodes that the learner trains on (valid, an action token, a group with reward spread)."""
    episodes = [e for e in map(json.loads, path.open()) if e["step"] == step and not e.get("discarded")]
    by_group: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for e in episodes:
        by_group[e["group_id"]].append(e)
    kept: list[dict[str, Any]] = []
    for group in by_group.values():
        valid = [e for e in group if e["valid"] and any(e["loss_mask"][1:])]
        if len({e["reward"] for e in valid}) > 1:
            kept.extend(valid)
    return kept


def run_layout(
    policy: Policy, seqs: list[list[int]], masks: list[list[int]], bins: list[list[int]], layout: str
) -> tuple[float, torch.Tensor]:
    """CPU seconds of every micro-batch's forward + backward, and the logprobs in the sequences' order."""
    out: dict[int, torch.Tensor] = {}
    t0 = time.process_time()
    for b in bins:
        needed = torch.tensor([bool(x) and t > 0 for i in b for t, x in enumerate(masks[i])])
        fwd = policy_forward(
            policy,
            [seqs[i] for i in b],
            temperature=1.0,
            values=False,
            layout=layout,
            needed=needed,  # type: ignore[arg-type]
        )
        (fwd.logprobs * needed).sum().backward()
        for i, lp in zip(b, fwd.split("logprobs"), strict=True):
            out[i] = lp.detach()
    cpu = time.process_time() - t0
    policy.model.zero_grad(set_to_none=True)
    return cpu, torch.cat([out[i] for i in range(len(seqs))])


def run_reference(
    policy: Policy, seqs: list[list[int]], masks: list[list[int]], bins: list[list[int]], grouped: bool
) -> tuple[float, torch.Tensor]:
    """CPU seconds of the reference's forward over every micro-batch, and its logprobs on the action tokens.

    ``grouped``: ``prefix_grouped`` scoring the action tokens only; else packed, every token scored.
    """
    reference = ReferencePolicy.for_policy(policy, layout="prefix_grouped" if grouped else "packed")
    out: dict[int, torch.Tensor] = {}
    t0 = time.process_time()
    for b in bins:
        needed = torch.tensor([bool(x) and t > 0 for i in b for t, x in enumerate(masks[i])])
        fwd = reference.logprobs([seqs[i] for i in b], needed=needed if grouped else None)
        for i, lp, keep in zip(
            b, fwd.split("logprobs"), torch.split(needed, [len(seqs[i]) for i in b]), strict=True
        ):
            out[i] = lp[keep]
    return time.process_time() - t0, torch.cat([out[i] for i in range(len(seqs))])


def compare_references(args: argparse.Namespace, policy: Policy) -> None:
    """``--reference``: the KL reference's forward, packed over every token against grouped over the needed."""
    print(
        "| step | episodes | tokens | micro-batches | packed, every token CPU (s) | grouped, needed CPU (s) | speedup | max logprob diff |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    totals = [0.0, 0.0]
    for step in (int(s) for s in args.steps.split(",")):
        episodes = trained_episodes(args.run / "trajectories.jsonl", step)
        seqs, masks = [e["token_ids"] for e in episodes], [e["loss_mask"] for e in episodes]
        bins = pack_prefix_groups(seqs, args.micro_batch_tokens)
        run_reference(policy, seqs, masks, bins, False)  # warm-up
        times: list[list[float]] = [[], []]
        logprobs: list[torch.Tensor] = [torch.empty(0), torch.empty(0)]
        for _ in range(args.repeats):
            for side in (0, 1):
                cpu, logprobs[side] = run_reference(policy, seqs, masks, bins, bool(side))
                times[side].append(cpu)
        best = [min(t) for t in times]
        totals = [totals[0] + best[0], totals[1] + best[1]]
        diff = float((logprobs[0] - logprobs[1]).abs().max())
        print(
            f"| {step} | {len(seqs)} | {sum(map(len, seqs))} | {len(bins)} | {best[0]:.3f} | {best[1]:.3f} | "
            f"{best[0] / best[1]:.2f} | {diff:.1e} |",
            flush=True,
        )
    print(f"reference_grouped_vs_packed_speedup: {totals[0] / totals[1]:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(
        description="padded vs prefix_grouped update layouts on a run's GRPO steps"
    )
    parser.add_argument("run", type=Path, help="a run directory (trajectories.jsonl, checkpoints/)")
    parser.add_argument("--steps", default="1,25,50")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--micro-batch-tokens", type=int, default=2048, help="the cpu profile's optim value")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument("--reference", action="store_true", help="time the KL reference's forward instead")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    _, loaded = open_checkpoint(args.run)
    policy = Policy.from_pretrained(str(loaded.subdir("policy")), value_head=False)
    policy.model.train()
    print(
        f"# {platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__} ({torch.get_num_threads()} "
        f"threads), load {os.getloadavg()[0]:.1f}; run {args.run}, micro_batch_tokens {args.micro_batch_tokens}"
    )
    if args.reference:
        with torch.no_grad():
            compare_references(args, policy)
        return
    print(
        "| step | episodes | tokens | micro-batches padded / grouped | padded CPU (s) | grouped CPU (s) | speedup | max logprob diff |"
    )
    print("|---:|---:|---:|---|---:|---:|---:|---:|")
    totals = {"padded": 0.0, "prefix_grouped": 0.0}
    for step in (int(s) for s in args.steps.split(",")):
        episodes = trained_episodes(args.run / "trajectories.jsonl", step)
        seqs = [e["token_ids"] for e in episodes]
        masks = [e["loss_mask"] for e in episodes]
        bins = {
            "padded": pack_indices([len(s) for s in seqs], args.micro_batch_tokens),
            "prefix_grouped": pack_prefix_groups(seqs, args.micro_batch_tokens),
        }
        times: dict[str, list[float]] = {k: [] for k in bins}
        logprobs: dict[str, torch.Tensor] = {}
        run_layout(policy, seqs, masks, bins["padded"], "padded")  # warm-up
        for _ in range(args.repeats):
            for layout in bins:
                cpu, logprobs[layout] = run_layout(policy, seqs, masks, bins[layout], layout)
                times[layout].append(cpu)
        best = {k: min(v) for k, v in times.items()}
        diff = float((logprobs["padded"] - logprobs["prefix_grouped"]).abs().max())
        for k in totals:
            totals[k] += best[k]
        print(
            f"| {step} | {len(seqs)} | {sum(map(len, seqs))} | {len(bins['padded'])} / {len(bins['prefix_grouped'])} | "
            f"{best['padded']:.3f} | {best['prefix_grouped']:.3f} | {best['padded'] / best['prefix_grouped']:.2f} | "
            f"{diff:.1e} |",
            flush=True,
        )
    print(f"prefix_grouped_vs_padded_speedup: {totals['padded'] / totals['prefix_grouped']:.2f}")


if __name__ == "__main__":
    main()
