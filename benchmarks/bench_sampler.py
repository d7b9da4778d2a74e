"""Sampler and training-forward throughput of mcprl-policy on the embedded tiny model (CPU).

1. Multi-turn episodes (3 turns; each turn samples a fixed number of greedy tokens, then a fixed tool
   response is appended) run concurrently through one HFSampler (dynamic + continuous batching) versus the
   same episodes one request at a time (max_batch_size=1, sequential). Greedy decoding is batch-invariant
   here (tested), so both runs generate the same tokens. Scaling table at 1, 8, 32, 64 concurrent episodes.
2. The prefix cache: the same multi-turn episodes with a longer system prompt (so the conversation, not the
   new tokens, dominates each turn's prompt, as in the demo) with `prefix_cache_mb` on versus off; each turn
   after the first then prefills only the tool response. Greedy, same tokens in both (checked).
3. Training forward + backward (logprobs of every token) over the demo's length mix (its warm-start
   demonstrations rendered with their tasks' tool schemas): one naive padded batch, the ``cpu`` profile's
   length-sorted padded micro-batches, and the same micro-batches packed with varlen attention.

Writes its own `## bench_sampler` section of benchmarks/RESULTS.md; prints `packed_vs_padded_speedup: <ratio>`
(the best layout against the naive padded batch, target ≥ 1.5) and `dynamic_batching_speedup: <ratio>` at 32
episodes (target ≥ 6).
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio
import torch
from results_md import replace_section

from mcprl_policy import HFSampler, Policy, SamplingParams

TURNS = 3
NEW_TOKENS = 24


def _episode_prompt(policy: Policy, i: int) -> list[int]:
    return policy.tokenizer.apply_chat_template(
        [{"role": "user", "content": f"What is {i % 7 + 2} times the price of ACME? Use the tools."}],
        add_generation_prompt=True,
        tokenize=True,
        return_dict=False,
    )


async def _episode(sampler: HFSampler, prompt: list[int], tool_turn: list[int]) -> int:
    tokens = list(prompt)
    generated = 0
    for _ in range(TURNS):
        completion = await sampler.sample(tokens, max_new_tokens=NEW_TOKENS)
        generated += len(completion.token_ids)
        tokens += completion.token_ids + tool_turn
    return generated


async def _run_concurrent(sampler: HFSampler, prompts: list[list[int]], tool_turn: list[int]) -> int:
    counts: list[int] = []

    async def one(p: list[int]) -> None:
        counts.append(await _episode(sampler, p, tool_turn))

    async with anyio.create_task_group() as tg:
        for p in prompts:
            tg.start_soon(one, p)
    return sum(counts)


async def _run_sequential(sampler: HFSampler, prompts: list[list[int]], tool_turn: list[int]) -> int:
    return sum([await _episode(sampler, p, tool_turn) for p in prompts])


def _timed(fn, *args) -> tuple[float, int]:
    start = time.perf_counter()
    tokens = anyio.run(fn, *args)
    return time.perf_counter() - start, tokens


def bench_sampling(
    policy: Policy, sizes: list[int]
) -> tuple[list[tuple[int, float, int, float]], float, float]:
    tool_turn = policy.tokenizer.encode(
        '\n<|im_start|>user\n<tool_response>\n{"symbol":"ACME","price":123.45}\n</tool_response><|im_end|>\n'
        "<|im_start|>assistant\n",
        add_special_tokens=False,
    )
    greedy = SamplingParams(temperature=0.0)
    # warm-up (thread pool, kernels)
    anyio.run(_run_concurrent, HFSampler(policy, greedy), [_episode_prompt(policy, 0)] * 4, tool_turn)
    single = HFSampler(policy, greedy, max_batch_size=1)
    seq_prompts = [_episode_prompt(policy, i) for i in range(32)]
    seq_time, seq_tokens = _timed(_run_sequential, single, seq_prompts, tool_turn)
    seq_rate = seq_tokens / seq_time
    rows = []
    for n in sizes:
        sampler = HFSampler(policy, greedy, max_batch_size=64, max_wait_ms=5)
        elapsed, tokens = _timed(
            _run_concurrent, sampler, [_episode_prompt(policy, i) for i in range(n)], tool_turn
        )
        rows.append((n, elapsed, tokens, sampler.metrics()["sampler/decode_rows_mean"]))
        if n == 32:
            assert tokens == seq_tokens, "batched and sequential greedy runs generated different token counts"
    dyn32 = next(r for r in rows if r[0] == 32)
    speedup = seq_time / dyn32[1]
    return rows, seq_rate, speedup


PREFIX_EPISODES = 64
PREFIX_TURNS = 4


async def _prefix_episode(
    sampler: HFSampler, prompt: list[int], tool_turn: list[int], out: list[list[int]]
) -> None:
    tokens = list(prompt)
    for _ in range(PREFIX_TURNS):
        completion = await sampler.sample(tokens, max_new_tokens=NEW_TOKENS)
        tokens += completion.token_ids + tool_turn
    out.append(tokens)


async def _run_prefix(sampler: HFSampler, prompts: list[list[int]], tool_turn: list[int]) -> list[list[int]]:
    out: list[list[int]] = []
    async with anyio.create_task_group() as tg:
        for p in prompts:
            tg.start_soon(_prefix_episode, sampler, p, tool_turn, out)
    return sorted(out)


def bench_prefix_cache(policy: Policy) -> tuple[float, float, int, float]:
    """Seconds without and with the prefix cache, prompt tokens per episode at the first turn, reuse share."""
    tool_turn = policy.tokenizer.encode(
        '\n<|im_start|>user\n<tool_response>\n{"symbol":"ACME","price":123.45,"currency":"USD"}\n'
        "</tool_response><|im_end|>\n<|im_start|>assistant\n",
        add_special_tokens=False,
    )
    system = (
        "You answer with tools. Tools: get_quote(symbol), calculate(expression), post_message(channel, text). "
        * 2
    )
    prompts = [
        policy.tokenizer.apply_chat_template(
            [{"role": "system", "content": system}, {"role": "user", "content": f"Price of ACME times {i}?"}],
            add_generation_prompt=True,
            tokenize=True,
            return_dict=False,
        )
        for i in range(PREFIX_EPISODES)
    ]
    greedy = SamplingParams(temperature=0.0)
    times: dict[float, float] = {}
    results: dict[float, list[list[int]]] = {}
    reuse = 0.0
    for mb in (0.0, 256.0, 0.0, 256.0):  # alternated, best of two: warm-up and load drift hit both alike
        sampler = HFSampler(policy, greedy, max_batch_size=128, max_wait_ms=5, prefix_cache_mb=mb)
        start = time.perf_counter()
        results[mb] = anyio.run(_run_prefix, sampler, prompts, tool_turn)
        times[mb] = min(times.get(mb, float("inf")), time.perf_counter() - start)
        stats = sampler.engine.stats
        if mb:
            reuse = stats.prefix_tokens / max(1, stats.prefix_tokens + stats.prefill_tokens)
    assert results[0.0] == results[256.0], "the prefix cache changed the greedy tokens"
    return times[0.0], times[256.0], len(prompts[0]), reuse


def demo_sequences(policy: Policy, n: int) -> list[list[int]]:
    """Token ids of ``n`` of the demo's warm-start demonstrations, rendered as the trainer renders them.

    The ``cpu`` profile's demonstrations (the imperfect teacher's episodes over the demo's tasks), each with the
    tool schemas of its task read from the three real offline MCP servers and the model's chat template: the
    demo's mix of one- to three-call episodes.
    """
    from mcprl_env import Environment
    from mcprl_train import build
    from mcprl_train.cassettes import tool_manager
    from mcprl_train.config import Config
    from mcprl_train.loop.warm_start import render_demonstrations

    config = Config.load("cpu", overrides=[f"sft.demos={n}"])
    train_set, _ = build.load_tasks(config)
    demos = build.load_demos(config)

    async def render() -> list[list[int]]:
        with tempfile.TemporaryDirectory() as run_dir:
            async with tool_manager(config, Path(run_dir)) as manager:
                env = Environment(manager=manager, tokenizer=policy.tokenizer, config=config.env)
                examples = render_demonstrations(policy.tokenizer, demos, train_set, env)
        return [e.token_ids for e in examples]

    return anyio.run(render)


TRAIN_LAYOUTS = ("naive padded", "sorted padded", "packed varlen", "packed sdpa (block mask)")


def _implementation(layout: str) -> dict[str, str]:
    return {"implementation": "sdpa"} if layout == "packed sdpa (block mask)" else {}


def _cpu_seconds() -> float:
    """CPU time of the work: this thread's with one torch thread (robust to other processes), else the process's."""
    return time.thread_time() if torch.get_num_threads() == 1 else time.process_time()


def bench_training_forward(
    policy: Policy, seqs: list[list[int]], micro_batch_tokens: int, repeats: int
) -> dict[str, tuple[float, float]]:
    """Forward + backward of every sequence's per-token logprobs, per layout: best wall and CPU seconds.

    - ``naive padded``: one batch, every sequence right-padded to the longest.
    - ``sorted padded``: the ``cpu`` profile's path: first-fit-decreasing micro-batches of at most
      ``micro_batch_tokens`` tokens (`pack_indices`, as the learner builds them), each padded to its longest.
    - ``packed varlen``: the same micro-batches, each packed in one row (`policy_forward(layout="packed")`
      with the policy's attention implementation: per-sequence SDPA on CPU).
    - ``packed sdpa (block mask)``: the same packed rows with transformers' ``sdpa`` and the block-diagonal
      mask it derives from the restarting positions (what the packed layout computed before varlen attention).

    Layouts alternate within each repeat, so load drift hits all alike; the best of ``repeats`` is kept.
    """
    from mcprl_policy import Layout, policy_forward
    from mcprl_train.loop.samples import pack_indices

    bins = [[seqs[i] for i in b] for b in pack_indices([len(s) for s in seqs], micro_batch_tokens)]
    plans: dict[str, tuple[list[list[list[int]]], Layout]] = {
        "naive padded": ([seqs], "padded"),
        "sorted padded": (bins, "padded"),
        "packed varlen": (bins, "packed"),
        "packed sdpa (block mask)": (bins, "packed"),
    }
    model: Any = policy.model
    own: str = model.config._attn_implementation
    policy.train()

    def run(batches: list[list[list[int]]], layout: Layout, implementation: str = own) -> None:
        model.set_attn_implementation(implementation)
        try:
            for batch in batches:
                out = policy_forward(policy, batch, temperature=1.0, values=False, layout=layout)
                out.logprobs.sum().backward()
        finally:
            model.set_attn_implementation(own)

    best: dict[str, tuple[float, float]] = {}
    for name in TRAIN_LAYOUTS:  # warm-up
        run(*plans[name], **_implementation(name))
    for _ in range(repeats):
        for name in TRAIN_LAYOUTS:
            policy.model.zero_grad(set_to_none=True)
            wall, cpu = time.perf_counter(), _cpu_seconds()
            run(*plans[name], **_implementation(name))
            wall, cpu = time.perf_counter() - wall, _cpu_seconds() - cpu
            old = best.get(name, (float("inf"), float("inf")))
            best[name] = (min(old[0], wall), min(old[1], cpu))
    return best


def check_layouts_agree(policy: Policy, seqs: list[list[int]]) -> float:
    """Largest per-token logprob difference between the packed and padded layouts over ``seqs`` (no grad)."""
    from mcprl_policy import policy_forward

    with torch.no_grad():
        packed = policy_forward(policy, seqs, temperature=1.0, values=False, layout="packed").logprobs
        padded = policy_forward(policy, seqs, temperature=1.0, values=False, layout="padded").logprobs
    return float((packed - padded).abs().max())


def training_section(
    policy: Policy, *, sequences: int, micro_batch_tokens: int, repeats: int
) -> tuple[list[str], float]:
    """Section 3's lines for RESULTS.md and ``packed_vs_padded_speedup`` (best layout / naive padded, wall)."""
    seqs = demo_sequences(policy, sequences)
    lens = sorted(len(s) for s in seqs)
    worst = check_layouts_agree(policy, seqs[:64])
    best = bench_training_forward(policy, seqs, micro_batch_tokens, repeats)
    n_tokens = sum(lens)
    naive_wall, naive_cpu = best["naive padded"]
    # One torch thread: CPU seconds of this thread, robust to the other processes; else wall-clock.
    column = 1 if torch.get_num_threads() == 1 else 0
    winner = min(TRAIN_LAYOUTS[1:], key=lambda name: best[name][column])
    speedup = best["naive padded"][column] / best[winner][column]
    attn = getattr(policy.model.config, "_attn_implementation", "?")
    lines = [
        f"Training forward + backward (per-token logprobs, `policy_forward`) over {len(seqs)} of the demo's "
        f"warm-start demonstrations rendered with their tasks' tool schemas ({n_tokens} tokens; lengths "
        f"{lens[0]}–{lens[-1]}, median {lens[len(lens) // 2]}, mean {n_tokens / len(lens):.0f}); micro-batches of at "
        f"most {micro_batch_tokens} tokens as the learner packs them (`pack_indices`); attention "
        f"`{attn}`; best of {repeats}, layouts alternated; packed and padded logprobs agree to {worst:.1e}.",
        "",
        f"| layout | wall (s) | CPU (s, {'this thread' if torch.get_num_threads() == 1 else 'all threads'}) "
        "| tokens / s | vs naive padded |",
        "|---|---:|---:|---:|---:|",
    ]
    for name in TRAIN_LAYOUTS:
        wall, cpu = best[name]
        lines.append(
            f"| {name} | {wall:.2f} | {cpu:.2f} | {n_tokens / wall:,.0f} | {naive_wall / wall:.2f}× "
            f"(CPU {naive_cpu / cpu:.2f}×) |"
        )
    basis = "CPU time, one thread" if column else "wall-clock"
    lines += [
        "",
        f"packed_vs_padded_speedup: {speedup:.2f} ({winner} vs naive padded, {basis}; target ≥ 1.5)",
    ]
    return lines, speedup


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--sizes", default="1,8,32,64")
    parser.add_argument("--train-sequences", type=int, default=256, help="demonstrations in section 3")
    parser.add_argument("--micro-batch-tokens", type=int, default=2048, help="the cpu profile's optim value")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument("--training-only", action="store_true", help="section 3 alone, printed, not written")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    sizes = sorted({int(s) for s in args.sizes.split(",")} | {32})
    if args.threads:
        torch.set_num_threads(args.threads)
    policy = Policy.from_pretrained(args.model, value_head=True)
    started = time.perf_counter()
    train = {
        "sequences": args.train_sequences,
        "micro_batch_tokens": args.micro_batch_tokens,
        "repeats": args.repeats,
    }
    if args.training_only:
        train_lines, packed_speedup = training_section(policy, **train)
        print("\n".join(train_lines))
        print(f"load average {os.getloadavg()[0]:.1f}; wall {time.perf_counter() - started:.0f} s")
        return
    rows, seq_rate, speedup = bench_sampling(policy, sizes)
    no_cache_s, cache_s, first_prompt, reuse = bench_prefix_cache(policy)
    train_lines, packed_speedup = training_section(policy, **train)
    wall = time.perf_counter() - started
    load = os.getloadavg()[0]
    lines = [
        "## bench_sampler",
        "",
        f"HFSampler on the embedded `{args.model}` model: episodes of {TURNS} turns, {NEW_TOKENS} greedy tokens per "
        "turn, a fixed tool-response turn appended between turns (the prompt grows). Concurrent episodes share one "
        "sampler (dynamic batching, 5 ms gather, continuous joins between decode steps, max batch 64); the "
        "baseline runs the same 32 episodes one request at a time (max_batch_size=1). Same tokens in both "
        "(greedy; checked).",
        "",
        f"- command: `uv run python benchmarks/bench_sampler.py --model {args.model}`",
        f"- date: {dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC; wall {wall:.0f} s; load average at the end {load:.1f}",
        f"- machine: {platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__} "
        f"({torch.get_num_threads()} threads), Python {platform.python_version()}",
        "",
        "| concurrent episodes | wall (s) | generated tokens | tokens / s | mean rows per decode step | vs one-at-a-time |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for n, elapsed, tokens, rows_mean in rows:
        rate = tokens / elapsed
        lines.append(
            f"| {n} | {elapsed:.2f} | {tokens} | {rate:,.0f} | {rows_mean:.1f} | {rate / seq_rate:.1f}× |"
        )
    lines += [
        f"| 32, one at a time | {3 * 32 * NEW_TOKENS / seq_rate:.2f} | — | {seq_rate:,.0f} | 1.0 | 1.0× |",
        "",
        f"Prefix cache: {PREFIX_EPISODES} concurrent episodes of {PREFIX_TURNS} turns ({first_prompt}-token first "
        f"prompt, {NEW_TOKENS} greedy tokens and a tool response per turn, max batch 128): "
        f"{no_cache_s:.2f} s prefilling every turn whole, {cache_s:.2f} s with `prefix_cache_mb=256` "
        f"({no_cache_s / cache_s:.2f}×; {reuse:.0%} of the prompt tokens came from the cache; same tokens).",
        "",
        *train_lines,
        "",
        f"dynamic_batching_speedup: {speedup:.1f} (target ≥ 6)",
        "",
    ]
    text = "\n".join(lines)
    if not args.no_write:
        replace_section(text)
    print(text.rstrip("\n").split("\n\n", 1)[1])
    print(f"packed_vs_padded_speedup: {packed_speedup:.2f}")
    print(f"prefix_cache_speedup: {no_cache_s / cache_s:.2f}")
    print(f"dynamic_batching_speedup: {speedup:.2f}")


if __name__ == "__main__":
    main()
