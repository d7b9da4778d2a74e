"""Sampler and training-forward throughput of mcprl-policy on the embedded tiny model (CPU).

1. Multi-turn episodes (3 turns; each turn samples a fixed number of greedy tokens, then a fixed tool
   response is appended) run concurrently through one HFSampler (dynamic + continuous batching) versus the
   same episodes one request at a time (max_batch_size=1, sequential). Greedy decoding is batch-invariant
   here (tested), so both runs generate the same tokens. Scaling table at 1, 8, 32, 64 concurrent episodes.
2. The prefix cache: the same multi-turn episodes with a longer system prompt (so the conversation, not the
   new tokens, dominates each turn's prompt, as in the demo) with `prefix_cache_mb` on versus off; each turn
   after the first then prefills only the tool response. Greedy, same tokens in both (checked).
3. Training forward + backward (logprobs of every token) over variable-length sequences: packed into one
   row (block-diagonal attention via restarting positions) versus padded to the longest sequence.

Writes its own `## bench_sampler` section of benchmarks/RESULTS.md; the last line printed is
`dynamic_batching_speedup: <ratio>` at 32 episodes (target ≥ 6).
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import random
import time

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


def bench_training_forward(policy: Policy, repeats: int = 3) -> tuple[float, float, int]:
    rng = random.Random(0)
    vocab = len(policy.tokenizer)
    seqs = [[rng.randrange(vocab) for _ in range(rng.randint(64, 512))] for _ in range(16)]
    n_tokens = sum(len(s) for s in seqs)
    policy.train()

    def packed() -> None:
        policy.forward_packed(seqs).logprobs.sum().backward()

    def padded() -> None:
        width = max(len(s) for s in seqs)
        ids = torch.zeros(len(seqs), width, dtype=torch.long)
        mask = torch.zeros(len(seqs), width, dtype=torch.long)
        for i, s in enumerate(seqs):
            ids[i, : len(s)] = torch.tensor(s)
            mask[i, : len(s)] = 1
        logits = policy.model(input_ids=ids, attention_mask=mask, use_cache=False).logits[:, :-1].float()
        logp = torch.log_softmax(logits, -1).gather(-1, ids[:, 1:, None]).squeeze(-1)
        (logp * mask[:, 1:]).sum().backward()

    rates = []
    for fn in (packed, padded):
        fn()
        best = float("inf")
        for _ in range(repeats):
            policy.model.zero_grad(set_to_none=True)
            start = time.perf_counter()
            fn()
            best = min(best, time.perf_counter() - start)
        rates.append(n_tokens / best)
    return rates[0], rates[1], n_tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--sizes", default="1,8,32,64")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    sizes = sorted({int(s) for s in args.sizes.split(",")} | {32})
    policy = Policy.from_pretrained(args.model, value_head=True)
    started = time.perf_counter()
    rows, seq_rate, speedup = bench_sampling(policy, sizes)
    no_cache_s, cache_s, first_prompt, reuse = bench_prefix_cache(policy)
    packed_rate, padded_rate, n_tokens = bench_training_forward(policy)
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
        f"Training forward + backward (per-token logprobs) over 16 sequences of 64–512 tokens ({n_tokens} tokens): "
        f"packed {packed_rate:,.0f} tokens/s, padded {padded_rate:,.0f} tokens/s "
        f"(packed/padded {packed_rate / padded_rate:.2f}×).",
        "",
        f"dynamic_batching_speedup: {speedup:.1f} (target ≥ 6)",
        "",
    ]
    text = "\n".join(lines)
    if not args.no_write:
        replace_section(text)
    print(text.rstrip("\n").split("\n\n", 1)[1])
    print(f"packed_vs_padded_training_forward: {packed_rate / padded_rate:.2f}")
    print(f"prefix_cache_speedup: {no_cache_s / cache_s:.2f}")
    print(f"dynamic_batching_speedup: {speedup:.2f}")


if __name__ == "__main__":
    main()
