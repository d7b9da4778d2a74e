"""Benchmark: mcprl-grpo's vectorised GRPO step math vs a straightforward per-sample Python implementation.

The step: GRPO advantages over groups of 8 (one failed episode per 64 masked out), broadcast to policy tokens,
per-token clipped surrogate (ε_low 0.2, ε_high 0.28, dual-clip 3), k3 KL to a reference, and token-mean
aggregation of ``policy + β·KL`` over 2^20 packed tokens (episodes of 64-256 tokens, ~6.5k episodes, 75 % policy
tokens). The per-sample version loops over groups and episodes in Python with per-episode torch ops (what a
trainer written without segment ops does). Both must give the same numbers; a line prints the speedup.

Then each operation against verl's own functions on the same tensors (``grpo_vs_verl_min_ratio``, the smallest
mcprl/verl speed ratio over the rows): GRPO advantages, the clipped policy loss, each aggregation mode, the KL
estimators, entropy and log-probabilities from logits; float and bool masks; padded and packed layouts. verl runs
in its own virtual environment (``VERL_PYTHON``, default ``/tmp/verlenv/bin/python``); the benchmark exits with
the commands to make one when verl does not import there.

    uv run python benchmarks/bench_grpo.py [--reps 15] [--verl-only]

It replaces its own ``## bench_grpo`` and ``## bench_grpo: mcprl-grpo vs verl`` sections in
``benchmarks/RESULTS.md``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from results_md import replace_section

from mcprl_grpo import (
    AggregationMode,
    KLEstimator,
    PackedLayout,
    TokenMask,
    aggregate_loss,
    clipped_surrogate_loss,
    entropy_from_logits,
    expand_to_tokens,
    group_advantages,
    kl_loss,
    token_kl,
    token_logprobs,
)

TOKENS, GROUP, MIN_LEN, MAX_LEN = 1 << 20, 8, 64, 256
EPS_LOW, EPS_HIGH, DUAL, BETA = 0.2, 0.28, 3.0, 0.01


def make_batch(seed: int = 0) -> dict[str, torch.Tensor]:
    """A packed batch: episodes of 64-256 tokens back to back, 2^20 tokens in total, groups of 8."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(MIN_LEN, MAX_LEN + 1, (TOKENS // MIN_LEN,), generator=g)
    n = int((lengths.cumsum(0) <= TOKENS).sum()) // GROUP * GROUP
    lengths = lengths[:n]
    lengths[-1] += TOKENS - int(lengths.sum())
    seq_ids = torch.arange(n).repeat_interleave(lengths)
    logprobs = -torch.rand(TOKENS, generator=g) * 3
    return {
        "rewards": (torch.rand(n, generator=g) < 0.4).float(),
        "group_ids": torch.arange(n // GROUP).repeat_interleave(GROUP),
        "valid": torch.arange(n) % 64 != 5,  # one infrastructure failure per 64 episodes
        "lengths": lengths,
        "seq_ids": seq_ids,
        "mask": torch.rand(TOKENS, generator=g) > 0.25,  # prompt/tool-output tokens are not policy tokens
        "logprobs": logprobs,
        "old": logprobs + torch.randn(TOKENS, generator=g) * 0.15,
        "ref": logprobs + torch.randn(TOKENS, generator=g) * 0.1,
    }


def vectorised(b: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    adv = group_advantages(b["rewards"], b["group_ids"], estimator="grpo", valid=b["valid"])
    mask = b["mask"] & b["valid"][b["seq_ids"]]
    tok_adv = expand_to_tokens(adv, mask, seq_ids=b["seq_ids"])
    pg = clipped_surrogate_loss(
        b["logprobs"], b["old"], tok_adv, mask, eps_low=EPS_LOW, eps_high=EPS_HIGH, dual_clip=DUAL
    )
    kl = token_kl(b["logprobs"], b["ref"], mask, estimator="k3")
    return adv, aggregate_loss(pg + BETA * kl, mask, mode="token-mean")


def per_sample(b: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """The same math, one group and one episode at a time."""
    n = b["rewards"].shape[0]
    rewards, valid, gids = b["rewards"].tolist(), b["valid"].tolist(), b["group_ids"].tolist()
    groups: dict[int, list[int]] = {}
    for i in range(n):
        groups.setdefault(gids[i], []).append(i)
    adv = [0.0] * n
    for members in groups.values():
        live = [i for i in members if valid[i]]
        rs = [rewards[i] for i in live]
        if len(rs) < 2 or max(rs) == min(rs):
            continue
        mu, sd = statistics.fmean(rs), statistics.stdev(rs)
        for i in live:
            adv[i] = (rewards[i] - mu) / (sd + 1e-6)
    total, count, start = 0.0, 0, 0
    for i, length in enumerate(b["lengths"].tolist()):
        s0, start = start, start + length
        if not valid[i]:
            continue
        m = b["mask"][s0:start]
        lp, old, ref = b["logprobs"][s0:start][m], b["old"][s0:start][m], b["ref"][s0:start][m]
        ratio = torch.exp(lp - old)
        a = adv[i]
        loss = torch.maximum(-a * ratio, -a * ratio.clamp(1 - EPS_LOW, 1 + EPS_HIGH))
        if a < 0:
            loss = torch.minimum(loss, torch.full_like(loss, -DUAL * a))
        log_rho = ref - lp
        kl = torch.exp(log_rho) - 1 - log_rho
        total += float((loss + BETA * kl).sum())
        count += int(m.sum())
    return torch.tensor(adv), torch.tensor(total / max(count, 1))


VERL_SOURCE = "from PyPI: verl/trainer/ppo/core_algos.py and verl/utils/torch_functional.py"
LOGITS_SHAPE = (32, 256, 2048)
AGG_MODES: tuple[AggregationMode, ...] = (
    "token-mean",
    "seq-mean-token-mean",
    "seq-mean-token-sum",
    "seq-mean-token-sum-norm",
)
KL_ESTIMATORS: tuple[KLEstimator, ...] = ("k1", "k2", "k3")
AGG_BY_NAME: dict[str, AggregationMode] = dict(zip(AGG_MODES, AGG_MODES, strict=True))
KL_BY_NAME: dict[str, KLEstimator] = dict(zip(KL_ESTIMATORS, KL_ESTIMATORS, strict=True))

# Runs in verl's own environment: torch, numpy and verl only, never mcprl. It loads the tensors the driver
# saved, and answers each request "<row> <calls>" with the best time of that many calls and the row's value.
VERL_WORKER = r"""
import json, sys, time
import numpy as np
import torch
from omegaconf import OmegaConf
from verl.trainer.ppo import core_algos as ca
from verl.utils import torch_functional as vF

torch.set_num_threads(int(sys.argv[2]))
d = torch.load(sys.argv[1])
cfg = OmegaConf.create({"clip_ratio": 0.2, "clip_ratio_low": EPS_LOW, "clip_ratio_high": EPS_HIGH,
                        "clip_ratio_c": DUAL, "global_batch_info": {}})
index = d["group_ids"].numpy()

def row(name, mask):
    kind, _, arg = name.partition(":")
    if kind == "adv":
        return ca.compute_grpo_vectorized_outcome_advantage(d["token_rewards"], mask, index)[0]
    if kind == "policy":
        return ca.compute_policy_loss_vanilla(d["old_p"], d["logprobs_p"], d["tok_adv_p"], mask, "token-mean", cfg)[0]
    if kind == "agg":
        return ca.agg_loss(d["loss_p"], mask, arg)
    if kind == "kl":
        return ca.agg_loss(ca.kl_penalty(d["logprobs_p"], d["ref_p"], arg), mask, "token-mean")
    if kind == "entropy":
        return vF.entropy_from_logits(d["logits"])
    if kind == "logprobs":
        return vF.logprobs_from_logits(d["logits"], d["labels"])
    raise ValueError(name)

print(json.dumps({"torch": torch.__version__, "verl": __import__("verl").__version__}), flush=True)
for line in sys.stdin:
    name, masking, calls = line.split()
    mask = d["mask_p"] if masking == "bool" else d["mask_p"].float()
    best, value = float("inf"), None
    for _ in range(int(calls)):
        t0 = time.thread_time()
        value = row(name, mask)
        best = min(best, time.thread_time() - t0)
    print(json.dumps({"time": best, "value": float(value.double().sum())}), flush=True)
"""


@dataclass(frozen=True)
class Row:
    """One comparison: ``name`` selects the operation on both sides; ``masking`` is bool or float; ``layout``
    is padded (both sides on ``(B, T)``) or packed (mcprl on ``(L,)`` with ``seq_ids``, verl padded)."""

    name: str
    masking: str
    layout: str


def comparison_rows() -> list[Row]:
    names = ["adv", "policy", *(f"agg:{m}" for m in AGG_MODES), *(f"kl:{k}" for k in KL_ESTIMATORS)]
    rows = [Row(n, masking, "padded") for n in names for masking in ("float", "bool")]
    rows += [Row(n, "bool", "packed") for n in names if n != "adv"]
    return [*rows, Row("entropy", "-", "padded"), Row("logprobs", "-", "padded")]


def comparison_tensors(b: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The packed batch of `make_batch` laid out padded ``(B, T_max)`` as verl holds it, plus logits."""
    g = torch.Generator().manual_seed(1)
    lengths, seq_ids = b["lengths"], b["seq_ids"]
    n, t = int(lengths.shape[0]), MAX_LEN
    lengths = lengths.clamp(max=t)
    keep = torch.arange(t) < lengths.unsqueeze(-1)
    starts = torch.cumsum(b["lengths"], 0) - b["lengths"]
    flat = (starts.unsqueeze(-1) + torch.arange(t)).clamp(max=TOKENS - 1)

    def pad(x: torch.Tensor, fill: float) -> torch.Tensor:
        return torch.where(keep, x[flat], torch.full((), fill, dtype=x.dtype))

    mask_p = pad(b["mask"], False)
    packed_keep = torch.arange(TOKENS) - starts[seq_ids] < t
    adv = torch.randn(n, generator=g)
    loss_p = torch.randn(n, t, generator=g)
    token_rewards = torch.zeros(n, t)
    token_rewards[torch.arange(n), lengths - 1] = b["rewards"]
    return {
        "rewards": b["rewards"],
        "group_ids": b["group_ids"],
        "token_rewards": token_rewards,
        "mask_p": mask_p,
        "logprobs_p": pad(b["logprobs"], 0.0),
        "old_p": pad(b["old"], 0.0),
        "ref_p": pad(b["ref"], 0.0),
        "tok_adv_p": adv.unsqueeze(-1).expand(n, t).contiguous(),
        "loss_p": loss_p,
        "mask_l": b["mask"] & packed_keep,
        "seq_ids": seq_ids,
        "logprobs_l": b["logprobs"],
        "old_l": b["old"],
        "ref_l": b["ref"],
        "tok_adv_l": adv[seq_ids],
        "loss_l": loss_p[seq_ids, (torch.arange(TOKENS) - starts[seq_ids]).clamp(max=t - 1)],
        "logits": torch.randn(*LOGITS_SHAPE, generator=g) * 3,
        "labels": torch.randint(0, LOGITS_SHAPE[-1], LOGITS_SHAPE[:-1], generator=g),
    }


def mcprl_row(row: Row, d: dict[str, torch.Tensor]) -> Callable[[], torch.Tensor]:
    """mcprl-grpo's side of ``row``: a call computing the same value as the verl worker's."""
    kind, _, arg = row.name.partition(":")
    sfx = "_l" if row.layout == "packed" else "_p"
    # Packed rows get the micro-batch's layout, built once where the batch is packed (PackedLayout).
    seq_ids = PackedLayout.from_seq_ids(d["seq_ids"]) if row.layout == "packed" else None
    # A float mask is validated once, as the learner does where it builds the micro-batch (TokenMask.of); the
    # timed call gets the validated mask. verl gets the float tensor and multiplies by it unchecked.
    mask = d["mask" + sfx] if row.masking != "float" else TokenMask.of(d["mask_p"].float())
    lp, old, ref = d["logprobs" + sfx], d["old" + sfx], d["ref" + sfx]
    match kind:
        case "adv":
            return lambda: expand_to_tokens(group_advantages(d["rewards"], d["group_ids"]), mask)
        case "policy":
            return lambda: aggregate_loss(
                clipped_surrogate_loss(
                    lp, old, d["tok_adv" + sfx], mask, eps_low=EPS_LOW, eps_high=EPS_HIGH, dual_clip=DUAL
                ),
                mask,
            )
        case "agg":
            mode = AGG_BY_NAME[arg]
            return lambda: aggregate_loss(
                d["loss" + sfx], mask, mode=mode, max_tokens=MAX_LEN, seq_ids=seq_ids
            )
        case "kl":
            est = KL_BY_NAME[arg]
            return lambda: kl_loss(lp, ref, mask, estimator=est)
        case "entropy":
            return lambda: entropy_from_logits(d["logits"])
        case "logprobs":
            return lambda: token_logprobs(d["logits"], d["labels"])
        case _:
            raise ValueError(f"unknown row {row.name!r}")


class VerlWorker:
    """verl's functions in verl's own virtual environment, one request at a time over a pipe."""

    def __init__(self, python: str, tensors: Path, threads: int) -> None:
        source = VERL_WORKER.replace("EPS_LOW", repr(EPS_LOW)).replace("EPS_HIGH", repr(EPS_HIGH))
        self.proc = subprocess.Popen(
            [python, "-c", source.replace("DUAL", repr(DUAL)), str(tensors), str(threads)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.versions: dict[str, str] = json.loads(self._read())

    def _read(self) -> str:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise SystemExit(f"the verl worker exited with status {self.proc.wait()} (its error is above)")
        return line

    def best(self, row: Row, calls: int) -> tuple[float, float]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(f"{row.name} {row.masking} {calls}\n")
        self.proc.stdin.flush()
        out = json.loads(self._read())
        return float(out["time"]), float(out["value"])

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait()


def verl_python() -> str:
    """The interpreter of a virtual environment where verl imports, or a clear exit saying how to make one."""
    python = os.environ.get("VERL_PYTHON", "/tmp/verlenv/bin/python")
    probe = [python, "-c", "import verl.trainer.ppo.core_algos, verl.utils.torch_functional"]
    if not Path(python).exists() or subprocess.run(probe, capture_output=True).returncode != 0:
        raise SystemExit(
            f"verl does not import with {python}. Make a throwaway environment beside the workspace with the "
            "workspace's torch:\n  uv venv /tmp/verlenv --python .venv/bin/python\n"
            f"  uv pip install --python /tmp/verlenv verl torch=={torch.__version__.split('+')[0]}\n"
            "or point VERL_PYTHON at another interpreter that has verl."
        )
    return python


def compare_with_verl(b: dict[str, torch.Tensor], reps: int) -> tuple[list[str], dict[Row, float], str]:
    """Alternate mcprl and verl on every row ``reps`` times, one torch thread each; best CPU time of each.

    Times are the calling thread's CPU time (`time.thread_time`): on a shared machine a process that is
    descheduled mid-call does not count against it, as it would in wall time. Returns table, ratios, versions.
    """
    threads = 1
    python = verl_python()
    d = comparison_tensors(b)
    torch.set_num_threads(threads)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "tensors.pt"
        torch.save(d, path)
        worker = VerlWorker(python, path, threads)
    rows = comparison_rows()
    best: dict[Row, list[float]] = {r: [float("inf"), float("inf")] for r in rows}
    values: dict[Row, tuple[float, float]] = {}
    try:
        for _ in range(reps):
            for r in rows:
                fn = mcprl_row(r, d)
                t0 = time.thread_time()
                out = fn()
                best[r][0] = min(best[r][0], time.thread_time() - t0)
                ours = float(out.double().sum())
                t_verl, theirs = worker.best(r, 1)
                best[r][1] = min(best[r][1], t_verl)
                values[r] = (ours, theirs)
    finally:
        worker.close()
    for r, (ours, theirs) in values.items():
        if not math.isclose(ours, theirs, rel_tol=1e-4, abs_tol=1e-4):
            raise SystemExit(f"{r}: mcprl {ours!r} differs from verl {theirs!r}")
    table = [
        "| operation | mask | layout (mcprl / verl) | mcprl (ms) | verl (ms) | mcprl speed / verl |",
        "|---|---|---|---:|---:|---:|",
    ]
    ratios: dict[Row, float] = {}
    for r in rows:
        ours_t, verl_t = best[r]
        ratios[r] = verl_t / ours_t
        layout = "packed (L,) / padded (B, T)" if r.layout == "packed" else "padded (B, T)"
        table.append(
            f"| {r.name} | {r.masking} | {layout} | {ours_t * 1e3:.2f} | {verl_t * 1e3:.2f} | {ratios[r]:.2f} |"
        )
    versions = f"verl {worker.versions['verl']} with torch {worker.versions['torch']}"
    return table, ratios, versions


def timed(fn, b: dict[str, torch.Tensor], calls: int) -> tuple[float, tuple[torch.Tensor, torch.Tensor]]:
    """Best CPU time of the calling thread over ``calls`` calls (one torch thread: the machine is shared, and
    time spent descheduled does not count)."""
    times = []
    out = None
    for _ in range(calls):
        t0 = time.thread_time()
        out = fn(b)
        times.append(time.thread_time() - t0)
    assert out is not None
    return min(times), out


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--reps", type=int, default=15, help="alternating repetitions per verl row")
    parser.add_argument("--verl-only", action="store_true", help="skip the per-sample loop comparison")
    args = parser.parse_args()
    b = make_batch()
    if not args.verl_only:
        vs_loop(b)
    vs_verl(b, args.reps)


def machine_line() -> str:
    return (
        f"{cpu_name()}, {os.cpu_count()} cores, torch {torch.__version__}, Python {platform.python_version()}, "
        f"{platform.system()} {platform.machine()}"
    )


def vs_verl(b: dict[str, torch.Tensor], reps: int) -> None:
    load_before = os.getloadavg()
    start = time.perf_counter()
    table, ratios, versions = compare_with_verl(b, reps)
    min_ratio = min(ratios.values())
    bool_min = min(v for r, v in ratios.items() if r.masking != "float")
    wall = time.perf_counter() - start
    load_after = os.getloadavg()
    for line in table:
        print(line)
    section = "\n".join(
        [
            "## bench_grpo: mcprl-grpo vs verl",
            "",
            "What each side is given: float rows hand mcprl the float mask validated once into a TokenMask "
            "(`TokenMask.of`, outside the timed call, as a learner does once per micro-batch: it checks the 0/1 "
            "values and keeps the bool mask, the float32 weights and the per-row counts); verl multiplies by the "
            "float mask as given and checks nothing. A bare float mask given to mcprl is still checked on every "
            "call. Bool rows give both sides the bool tensor. Packed rows hand mcprl the batch's PackedLayout "
            "(`PackedLayout.from_seq_ids`, built once per micro-batch, outside the timed call); its seq-* rows sum "
            "per sequence from 32-entry chunk sums and each boundary's partial chunk, where verl's padded rows "
            "are one row sum each.",
            "",
            f"Each row computes the same value with mcprl-grpo and with {versions} ({VERL_SOURCE}), run in its own "
            "virtual environment beside the workspace (a worker process loads the same tensors; values checked "
            "equal). Forward only. Batch: the packed batch above "
            f"({TOKENS:,} tokens) padded to (B, {MAX_LEN}) for verl and for mcprl's padded rows; packed rows give "
            f"mcprl the (L,) layout with its PackedLayout. Logits rows: {LOGITS_SHAPE}. The two sides alternate row by row, "
            f"{reps} times; each figure is the best of its {reps} calls in CPU time of the calling thread "
            "(`time.thread_time`, one torch thread on both sides, so time spent descheduled on this shared "
            "machine does not count). "
            "`policy` is verl's compute_policy_loss_vanilla (dual-clip 3, clip 0.2/0.28, token-mean; it also "
            "computes its three clip/KL metrics) against clipped_surrogate_loss + aggregate_loss; `kl:*` is "
            "kl_penalty + agg_loss(token-mean) against kl_loss; `adv` is compute_grpo_vectorized_outcome_advantage "
            "against group_advantages + expand_to_tokens.",
            "",
            f"- command: `uv run python benchmarks/bench_grpo.py --reps {reps}` (`--verl-only` runs this section alone) "
            "(VERL_PYTHON: verl's interpreter, default /tmp/verlenv/bin/python)",
            f"- date: {dt.datetime.now(dt.UTC).strftime('%Y-%m-%d %H:%M UTC')}, wall {wall:.0f} s",
            f"- machine: {machine_line()}",
            f"- load average (1/5/15 min) before {load_before[0]:.1f}/{load_before[1]:.1f}/{load_before[2]:.1f}, "
            f"after {load_after[0]:.1f}/{load_after[1]:.1f}/{load_after[2]:.1f} (a shared machine)",
            "",
            *table,
            "",
            f"grpo_vs_verl_min_ratio: {min_ratio:.2f} (target ≥ 1); over the bool-mask rows alone: {bool_min:.2f}",
            "",
        ]
    )
    replace_section(section)
    print(f"grpo_vs_verl_min_ratio: {min_ratio:.2f}")


def vs_loop(b: dict[str, torch.Tensor]) -> None:
    tokens = int(b["mask"].numel())
    episodes = int(b["rewards"].shape[0])
    policy_tokens = int((b["mask"] & b["valid"][b["seq_ids"]]).sum())
    # One torch thread on both sides: thread CPU time counts only the calling thread, and the loop's
    # per-episode ops are far below torch's parallel grain size anyway.
    default_threads = torch.get_num_threads()
    torch.set_num_threads(1)
    vec = {1: timed(vectorised, b, calls=6)}
    loop = {1: timed(per_sample, b, calls=2)}
    torch.set_num_threads(default_threads)
    vec_threads = min(vec, key=lambda k: vec[k][0])
    loop_threads = 1
    t_vec, (adv_v, loss_v) = vec[vec_threads]
    t_loop, (adv_l, loss_l) = loop[loop_threads]
    torch.testing.assert_close(adv_v, adv_l, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(loss_v, loss_l, atol=1e-5, rtol=1e-4)
    speedup = t_loop / t_vec
    rows = [
        (f"vectorised (mcprl_grpo, {vec_threads} thread(s))", t_vec, tokens / t_vec),
        (f"per-sample Python loop ({loop_threads} thread(s))", t_loop, tokens / t_loop),
    ]
    table = ["| implementation | best time per step (s) | tokens / s |", "|---|---:|---:|"]
    table += [f"| {name} | {t:.4f} | {rate:,.0f} |" for name, t, rate in rows]
    for line in table:
        print(line)
    print(
        f"episodes {episodes} in groups of {GROUP}, packed tokens {tokens:,}, policy tokens {policy_tokens:,}"
    )
    print(
        f"loss vectorised {float(loss_v):.8f} vs per-sample {float(loss_l):.8f} (advantages and loss match)"
    )
    machine = (
        f"{cpu_name()}, {os.cpu_count()} cores, torch {torch.__version__} (1 thread, best CPU time of the thread), "
        f"Python {platform.python_version()}, {platform.system()} {platform.machine()}, "
        f"load average {os.getloadavg()[0]:.1f} at the end (the machine is shared; figures move with load)"
    )
    section = "\n".join(
        [
            "## bench_grpo",
            "",
            "GRPO advantages + clipped surrogate (ε 0.2/0.28, dual-clip 3) + k3 KL + token-mean aggregation over "
            f"{tokens:,} packed tokens ({episodes} episodes of {MIN_LEN}-{MAX_LEN} tokens, groups of {GROUP}), vectorised "
            "mcprl-grpo vs a per-sample Python loop of the same math (results checked equal). Times are the thread's "
            "CPU time with one torch thread; wall time, used before, also counts the time a busy machine keeps "
            "the process waiting (the loop suffers more from it).",
            "",
            "- command: `uv run python benchmarks/bench_grpo.py`",
            f"- date: {dt.datetime.now(dt.UTC).strftime('%Y-%m-%d %H:%M UTC')}",
            f"- machine: {machine}",
            "",
            *table,
            "",
            f"grpo_vectorized_speedup: {speedup:.1f} (target ≥ 20)",
            "",
        ]
    )
    replace_section(section)
    print(f"grpo_vectorized_speedup: {speedup:.1f}")


if __name__ == "__main__":
    sys.exit(main())
