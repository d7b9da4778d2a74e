"""What ``torch.compile`` (inductor) buys the demo's decode step and update on this machine, compile time included.

Three measurements on the demo's model (a checkpoint's policy, or the cpu profile's untrained ``tiny-8h``):

- decode: one engine decode step (`mcprl_policy.kv_pool.KVPool.step`) with the lean forward eager and with its
  pure-tensor parts compiled (`mcprl_policy.lean_decode`'s ``_projections``: input norm, projections, q/k norms
  and rotary; ``_mlp_block``: o_proj, residuals, post norm and MLP; ``_logits``: final norm and head; the pool
  write and SDPA stay eager), dynamic shapes. Compile
  time (the first step's wall and thread CPU), the frames and graphs dynamo compiled over a sweep of rows and
  columns (recompiles), the largest logit difference to the eager step, then thread CPU per step at each
  ``--decode-shapes`` shape, best of ``--repeats``, the sides alternating;
- update: the padded forward (`mcprl_policy.padded.padded_forward`, as `TorchBackend` runs it) and the backward
  of its logprobs' sum over the demo's length mix packed into ``--micro-batch-tokens`` micro-batches as
  `Learner.pack` does, eager with SDPA's default CPU kernel (flash), eager with SDPA's math backend, and with the
  decoder layers compiled (`mcprl_policy.compiled.CompiledLayers`, as ``optim.compile`` runs them), thread CPU
  per pass over every micro-batch, best of ``--repeats``, alternating; the first compiled pass's wall-clock
  (compile included) and the graphs compiled;
- the gradients' largest relative difference to the eager pass, per side.

Run with one torch thread on a shared machine; inductor caches what it compiled on disk, so a cold compile needs
a fresh cache directory::

    TORCHINDUCTOR_CACHE_DIR=$(mktemp -d) OMP_NUM_THREADS=1 uv run python benchmarks/bench_compile.py \
        [--checkpoint outputs/warm]
"""

from __future__ import annotations

import argparse
import os
import random
import time
from collections.abc import Sequence
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import torch
from torch._dynamo.utils import counters
from torch.nn.attention import SDPBackend, sdpa_kernel

from mcprl_policy import Policy, lean_decode
from mcprl_policy.compiled import CompiledLayers
from mcprl_policy.kv_pool import KVPool
from mcprl_policy.lean_decode import LeanDecoder, LeanOutput
from mcprl_policy.padded import padded_forward
from mcprl_train.config import Config
from mcprl_train.loop.samples import pack_indices
from mcprl_train.run.run_dir import open_checkpoint


def load_model(checkpoint: Path | None) -> tuple[torch.nn.Module, str]:
    config = Config.load(profile="cpu")
    name = config.model.name
    if checkpoint is not None:
        _, loaded = open_checkpoint(checkpoint)
        name = str(loaded.subdir("policy"))
    policy = Policy.from_pretrained(
        name, value_head=False, attn_implementation=config.model.attn_implementation
    )
    return policy.model, name


def filled_pool(model: torch.nn.Module, rows: int, length: int) -> tuple[KVPool, torch.Tensor, torch.Tensor]:
    """A pool holding ``rows`` ragged prefilled rows (row ``i`` left-padded by ``i % 32``), as `bench_step`."""
    from transformers import DynamicCache

    pads = [i % 32 for i in range(rows)]
    ids = torch.randint(5, 200, (rows, length))
    mask = torch.tensor([[0] * p + [1] * (length - p) for p in pads])
    cache = DynamicCache(config=getattr(model, "config", None))
    model(
        input_ids=ids,
        attention_mask=mask,
        position_ids=(mask.cumsum(-1) - 1).clamp(min=0),
        past_key_values=cache,
        use_cache=True,
        logits_to_keep=1,
    )
    pool = KVPool(max_rows=rows, device=ids.device)
    pool.merge(cache, mask)
    return pool, ids[:, -1], mask.sum(-1)


def decode_steps(model: torch.nn.Module, forward: LeanDecoder, rows: int, length: int, steps: int) -> float:
    """Thread CPU seconds per decode step over ``steps`` greedy steps from a fresh pool."""
    pool, last, positions = filled_pool(model, rows, length)
    t = time.thread_time()
    for _ in range(steps):
        last = pool.step(forward, last, positions).argmax(-1)
        positions = positions + 1
    return (time.thread_time() - t) / steps


class CompiledLean(LeanDecoder):
    """`LeanDecoder` with its pure-tensor parts compiled (dynamic shapes), for this measurement only."""

    def __call__(self, **kwargs: Any) -> LeanOutput:
        plain = {name: getattr(lean_decode, name) for name in _COMPILED_PARTS}
        for name in _COMPILED_PARTS:
            setattr(lean_decode, name, _COMPILED[name])
        try:
            return super().__call__(**kwargs)
        finally:
            for name, fn in plain.items():
                setattr(lean_decode, name, fn)


_COMPILED_PARTS = ("_projections", "_mlp_block", "_logits")
_COMPILED = {name: torch.compile(getattr(lean_decode, name), dynamic=True) for name in _COMPILED_PARTS}


def decode_part(model: torch.nn.Module, shapes: Sequence[tuple[int, int]], repeats: int) -> list[str]:
    lines: list[str] = []
    eager, compiled = LeanDecoder(model), CompiledLean(model)
    rows0, length0 = shapes[0]
    pool, last, positions = filled_pool(model, rows0, length0)
    wall, cpu = time.perf_counter(), time.thread_time()
    pool.step(compiled, last, positions)
    lines.append(
        f"decode compile (first step, {rows0}x{length0}): {time.perf_counter() - wall:.1f} s wall, "
        f"{time.thread_time() - cpu:.1f} s thread CPU"
    )
    counters.clear()
    wall = time.perf_counter()
    worst = 0.0
    sweep = [(r, n) for r in (1, 7, 46, 73, 128) for n in (40, 134, 221, 400)]
    for rows, length in sweep:
        torch.manual_seed(rows * 1000 + length)
        a, last_a, pos_a = filled_pool(model, rows, length)
        torch.manual_seed(rows * 1000 + length)
        b, _, _ = filled_pool(model, rows, length)
        for _ in range(3):
            la = a.step(eager, last_a, pos_a)
            lb = b.step(compiled, last_a, pos_a)
            worst = max(worst, float((la - lb).abs().max()))
            last_a, pos_a = la.argmax(-1), pos_a + 1
    lines.append(
        f"decode sweep ({len(sweep)} shapes, rows 1-128 x columns 40-400, 3 steps each): "
        f"{counters['frames']['ok']} frames compiled, {counters['stats']['unique_graphs']} graphs "
        f"(recompiles after the first step), {time.perf_counter() - wall:.1f} s wall; largest |logit| difference "
        f"to eager {worst:.2e}"
    )
    for rows, length in shapes:
        best = {"eager": float("inf"), "compiled": float("inf")}
        for _ in range(repeats):
            for name, fwd in (("eager", eager), ("compiled", compiled)):
                best[name] = min(best[name], decode_steps(model, fwd, rows, length, 20))
        lines.append(
            f"decode step {rows}x{length} (thread CPU, best of {repeats} x 20 steps): eager lean "
            f"{best['eager'] * 1e3:.2f} ms, compiled {best['compiled'] * 1e3:.2f} ms "
            f"({best['eager'] / best['compiled']:.2f}x)"
        )
    return lines


def demo_lengths(n: int, seed: int) -> list[int]:
    """``n`` sequence lengths like a demo GRPO step's (mean ~250 tokens, 120-380)."""
    rng = random.Random(seed)
    return [rng.randint(120, 380) for _ in range(n)]


def update_pass(model: torch.nn.Module, micro: list[list[list[int]]], *, math: bool) -> float:
    """Thread CPU seconds of forward + backward over every micro-batch (SDPA's math backend or its default)."""
    t = time.thread_time()
    for sequences in micro:
        with sdpa_kernel(SDPBackend.MATH) if math else nullcontext():
            out = padded_forward(model, sequences, chunk_size=1024)
            out.logprobs.sum().backward()
    return time.thread_time() - t


def grads(model: torch.nn.Module) -> list[torch.Tensor]:
    return [p.grad.clone() for p in model.parameters() if p.grad is not None]


def update_part(model: torch.nn.Module, tokens: int, n: int, repeats: int) -> list[str]:
    lengths = demo_lengths(n, 0)
    rng = random.Random(1)
    sequences = [[rng.randint(5, 900) for _ in range(k)] for k in lengths]
    micro = [[sequences[i] for i in b] for b in pack_indices(lengths, tokens)]
    padded = sum(len(b) * max(len(s) for s in b) for b in micro)
    lines = [
        f"update: {n} sequences, {sum(lengths)} tokens in {len(micro)} micro-batches of <= {tokens} "
        f"({padded} with padding)"
    ]
    model.train()
    # Inside compiled layers the attention kernel is inductor's choice: SDPA's backend switch is not a guard.
    sides = ["eager, SDPA flash (default)", "eager, SDPA math", "compiled layers"]
    best = dict.fromkeys(sides, float("inf"))
    layers = CompiledLayers(model)
    reference: list[torch.Tensor] = []
    diffs: dict[str, float] = {}
    firsts: dict[str, float] = {}
    for r in range(repeats):
        for name in best:
            model.zero_grad(set_to_none=True)
            math = "math" in name
            with layers.active() if name.startswith("compiled") else nullcontext():
                if name.startswith("compiled") and name not in firsts:
                    counters.clear()
                    wall = time.perf_counter()
                    update_pass(model, micro, math=math)
                    firsts[name] = time.perf_counter() - wall
                    lines.append(
                        f"{name}: first pass {firsts[name]:.1f} s wall (compile), "
                        f"{counters['frames']['ok']} frames, {counters['stats']['unique_graphs']} graphs"
                    )
                    model.zero_grad(set_to_none=True)
                seconds = update_pass(model, micro, math=math)
            best[name] = min(best[name], seconds)
            g = grads(model)
            if not reference:
                reference = g
            if r == 0:
                diffs[name] = max(
                    float((a - b).abs().max() / b.abs().max().clamp(min=1e-30))
                    for a, b in zip(g, reference, strict=True)
                )
    base = best["eager, SDPA flash (default)"]
    for name, seconds in best.items():
        lines.append(
            f"update {name}: {seconds:.3f} s thread CPU per pass (best of {repeats}), {base / seconds:.2f}x; "
            f"largest gradient difference / max |grad| {diffs[name]:.1e}"
        )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--checkpoint", type=Path, default=None, help="a checkpoint or run directory")
    parser.add_argument("--part", choices=["decode", "update", "all"], default="all")
    parser.add_argument("--decode-shapes", nargs="+", default=["46x134", "73x220"], metavar="ROWSxTOKENS")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--micro-batch-tokens", type=int, default=2048)
    parser.add_argument("--sequences", type=int, default=224, help="sequences in the update's batch")
    args = parser.parse_args()
    shapes = []
    for shape in args.decode_shapes:
        rows, _, length = str(shape).partition("x")
        if not (rows.isdigit() and length.isdigit() and int(rows) > 0 and int(length) >= 32):
            parser.error(f"--decode-shapes takes ROWSxTOKENS with ROWS >= 1 and TOKENS >= 32, got {shape!r}")
        shapes.append((int(rows), int(length)))
    torch.manual_seed(0)
    model, name = load_model(args.checkpoint)
    print(
        f"model: {name}; torch {torch.__version__}, {torch.get_num_threads()} thread(s); "
        f"load average {os.getloadavg()[0]:.1f}"
    )
    if args.part in ("decode", "all"):
        model.eval()
        with torch.inference_mode():
            for line in decode_part(model, shapes, args.repeats):
                print(line, flush=True)
    if args.part in ("update", "all"):
        for line in update_part(model, args.micro_batch_tokens, args.sequences, args.repeats):
            print(line, flush=True)
    print(f"load average at the end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
