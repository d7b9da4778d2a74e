"""Peak resident memory per rank of a two-rank DeepSpeed run: sampling from the engine against a replica, and
the KL reference's share (``--kl-coefs 0.01 0``: the same run with and without a reference).

Runs ``mcprl-train --profile a100x2`` on 2 gloo ranks on CPU (fp32, no gradient checkpointing: what a CPU
needs) with a randomly initialised Qwen3 of ``--hidden``/``--layers`` (the embedded tiny model's tokenizer, a
wider and deeper body, so that the weights dominate the processes' memory) for ``--steps`` GRPO steps, once per
``distributed.sampling``, ZeRO stage and ``grpo.kl_coef`` (0 turns the reference off), the sides alternating
over ``--repeats``. Each rank's peak RSS is its
``VmHWM`` (``/proc/<pid>/status``), read every 0.2 s while the run lasts (the high-water mark only grows, so the
last reading before the rank exits is its peak).

    uv run python benchmarks/bench_ds_memory.py [--hidden 1024] [--layers 8] [--steps 1] [--repeats 1]
        [--stages 3 2] [--samplings replica engine] [--kl-coefs 0.01]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
from transformers import AutoConfig, Qwen3ForCausalLM

from mcprl_policy.tiny import build_tiny_model

_TESTS = Path(__file__).resolve().parents[1] / "packages/mcprl-train/tests"


def model_dir(root: Path, hidden: int, layers: int) -> tuple[Path, int]:
    """A random Qwen3 with the tiny model's tokenizer and vocabulary; returns its directory and size."""
    tiny = build_tiny_model("tiny")
    out = root / f"qwen3-h{hidden}-l{layers}"
    shutil.copytree(tiny, out)
    config = AutoConfig.from_pretrained(out)
    config.hidden_size = hidden
    config.num_hidden_layers = layers
    config.layer_types = ["full_attention"] * layers
    config.max_window_layers = layers
    config.intermediate_size = 3 * hidden
    config.num_attention_heads = hidden // 64
    config.num_key_value_heads = hidden // 128
    config.head_dim = 64
    for name in out.glob("*.safetensors"):
        name.unlink()
    model = Qwen3ForCausalLM(config)
    model.save_pretrained(out)
    return out, sum(p.numel() for p in model.parameters())


def vm_hwm_kib(pid: int) -> int | None:
    try:
        for row in Path(f"/proc/{pid}/status").read_text().splitlines():
            if row.startswith("VmHWM:"):
                return int(row.split()[1])
    except OSError:
        return None
    return None


def one_run(
    root: Path, model: Path, tasks: Path, sampling: str, stage: int, steps: int, kl: float
) -> tuple[list[int], tuple[float, float]]:
    """One run; each rank's peak RSS (MiB, by rank) and the load average before and after."""
    name = f"{sampling}-z{stage}-kl{kl}-{time.monotonic_ns()}"
    sets = [
        f"model.name={model}",
        "model.device=cpu",
        "model.dtype=float32",
        "model.gradient_checkpointing=false",
        "distributed.bf16=false",
        f"distributed.zero_stage={stage}",
        f"distributed.sampling={sampling}",
        f"run.output_dir={root / 'runs'}",
        f"run.name={name}",
        f"run.steps={steps}",
        "run.checkpoint_every=0",
        f"tasks.train={tasks}",
        f"tasks.validation={tasks}",
        "tools.offline=[finance]",
        "grpo.group_size=2",
        "grpo.tasks_per_step=2",
        f"grpo.kl_coef={kl}",
        *(["reference.every=0"] if kl == 0 else []),
        "env.max_new_tokens_per_turn=16",
        "env.max_turns_by_difficulty={easy: 2, medium: 2, hard: 2}",
        "collection.max_concurrent_episodes=2",
        "eval.every=0",
        "eval.n_tasks=2",
        "tracking.progress=false",
        "tracking.wandb=disabled",
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore", "WANDB_MODE": "disabled"}
    command = [
        sys.executable,
        "-m",
        "mcprl_train",
        "--profile",
        "a100x2",
        *[x for s in sets for x in ("--set", s)],
    ]
    load0 = os.getloadavg()[0]
    proc = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    peaks: dict[int, int] = {}
    ranks: dict[int, int] = {}
    parent = psutil.Process(proc.pid)
    while proc.poll() is None:
        try:
            children = parent.children(recursive=True)
        except psutil.NoSuchProcess:
            break
        for child in children:
            if child.pid not in ranks:
                try:
                    rank = child.environ().get("LOCAL_RANK")
                    cmdline = " ".join(child.cmdline())
                except (psutil.NoSuchProcess, psutil.AccessDenied):
                    continue
                if rank is None or "mcprl_train" not in cmdline:
                    continue
                ranks[child.pid] = int(rank)
            if (kib := vm_hwm_kib(child.pid)) is not None:
                peaks[ranks[child.pid]] = max(peaks.get(ranks[child.pid], 0), kib)
        time.sleep(0.2)
    _, stderr = proc.communicate()
    if proc.returncode != 0:
        raise SystemExit(f"{name} failed ({proc.returncode}):\n{stderr[-4000:]}")
    return [round(peaks[r] / 1024) for r in sorted(peaks)], (load0, os.getloadavg()[0])


def main() -> None:
    parser = argparse.ArgumentParser(description="Peak RSS per rank: engine sampling against a replica.")
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--steps", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--stages", type=int, nargs="+", default=[3, 2])
    parser.add_argument(
        "--samplings", nargs="+", default=["replica", "engine"], choices=["replica", "engine"]
    )
    parser.add_argument("--kl-coefs", type=float, nargs="+", default=[0.01])
    args = parser.parse_args()
    sys.path.insert(0, str(_TESTS))
    from train_testkit import demo_tasks  # the task file the DeepSpeed tests' runs use: the first quote tasks

    with tempfile.TemporaryDirectory(prefix="bench-ds-memory-") as tmp:
        root = Path(tmp)
        model, params = model_dir(root, args.hidden, args.layers)
        tasks = demo_tasks(root / "tasks.json", 2, families=["quote"])
        print(f"model: {params / 1e6:.1f} M params, fp32 {params * 4 / 2**20:.0f} MiB")
        print(
            "| ZeRO stage | distributed.sampling | grpo.kl_coef | peak RSS rank 0 (MiB) | peak RSS rank 1 (MiB) "
            "| load |"
        )
        print("|---:|---|---:|---:|---:|---|")
        for r in range(args.repeats):
            for stage in args.stages:
                sides = [(s, kl) for s in args.samplings for kl in args.kl_coefs]
                for sampling, kl in sides if r % 2 == 0 else reversed(sides):
                    peak, load = one_run(root, model, tasks, sampling, stage, args.steps, kl)
                    print(
                        f"| {stage} | {sampling} | {kl:g} | {peak[0]:,} | {peak[1]:,} "
                        f"| {load[0]:.1f}-{load[1]:.1f} |",
                        flush=True,
                    )


if __name__ == "__main__":
    main()
