"""The HF sampler on a Qwen3.5-style hybrid (gated-delta-net linear attention + full attention), CPU.

The model is a random ``Qwen3_5ForCausalLM`` (`mcprl_policy.standin.standin_model`: hidden 128, 4 layers
alternating linear and full attention) with the embedded tiny tokenizer; transformers runs its reference
PyTorch kernels (no fla / causal-conv1d on CPU). Episodes of 3 greedy turns (24 new tokens, then a fixed tool
response appended), run three ways with the same tokens (checked):

1. one request at a time (``max_batch_size=1``, no prefix cache);
2. all episodes concurrently, no prefix cache (continuous batching of conv + recurrent states);
3. concurrently with ``prefix_cache_mb=64`` (each later turn resumes the cached recurrent state and prefills
   only the tool response; continuations of different lengths prefill in separate passes).

Each side is timed best-of-``--repeats`` in wall and process CPU seconds (all threads), the sides alternating,
so that a loaded machine penalises them alike. Writes its own ``## bench_hybrid`` section of RESULTS.md.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import time
from collections.abc import Callable

import anyio
import torch
from results_md import replace_section

from mcprl_policy import HFSampler, Policy, SamplingParams, build_tiny_model
from mcprl_policy.standin import standin_model

TURNS = 3
NEW_TOKENS = 24


def _hybrid_policy() -> Policy:
    tiny = Policy.from_pretrained(str(build_tiny_model("tiny")), value_head=False)
    tokenizer = tiny.tokenizer
    model = standin_model(
        "qwen3.5",
        vocab_size=len(tokenizer),
        eos_token_id=int(tokenizer.convert_tokens_to_ids("<|im_end|>")),
        pad_token_id=int(tokenizer.pad_token_id),
        hidden_size=128,
        initializer_range=0.2,
    )
    return Policy(model=model.eval(), tokenizer=tokenizer, value_head=None, base_model="hybrid-standin")


async def _episodes(
    sampler: HFSampler, prompts: list[list[int]], tool: list[int], concurrent: bool
) -> list[list[int]]:
    out: dict[int, list[int]] = {}

    async def one(i: int) -> None:
        tokens = list(prompts[i])
        for _ in range(TURNS):
            completion = await sampler.sample(tokens, max_new_tokens=NEW_TOKENS)
            tokens += completion.token_ids + tool
        out[i] = tokens

    if concurrent:
        async with anyio.create_task_group() as tg:
            for i in range(len(prompts)):
                tg.start_soon(one, i)
    else:
        for i in range(len(prompts)):
            await one(i)
    return [out[i] for i in range(len(prompts))]


def main() -> None:
    parser = argparse.ArgumentParser(description="HF sampler throughput on a Qwen3.5-style hybrid stand-in")
    parser.add_argument("--episodes", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.manual_seed(0)
    policy = _hybrid_policy()
    tokenizer = policy.tokenizer
    system = "You answer with tools. Tools: get_quote(symbol), calculate(expression), post_message(channel, text). "
    prompts: list[list[int]] = [
        tokenizer.apply_chat_template(
            [
                {"role": "system", "content": system * 2},
                {"role": "user", "content": f"What is {i % 7 + 2} times the price of ACME?"},
            ],
            add_generation_prompt=True,
            tokenize=True,
            return_dict=False,
        )
        for i in range(args.episodes)
    ]
    tool = tokenizer.encode(
        '\n<|im_start|>user\n<tool_response>\n{"symbol":"ACME","price":123.45}\n</tool_response><|im_end|>\n'
        "<|im_start|>assistant\n",
        add_special_tokens=False,
    )
    greedy = SamplingParams(temperature=0.0)
    sides: dict[str, Callable[[], HFSampler]] = {
        "one at a time": lambda: HFSampler(policy, greedy, max_batch_size=1),
        "concurrent, no prefix cache": lambda: HFSampler(policy, greedy, max_batch_size=64, max_wait_ms=5),
        "concurrent, prefix cache": lambda: HFSampler(
            policy, greedy, max_batch_size=64, max_wait_ms=5, prefix_cache_mb=64
        ),
    }
    anyio.run(_episodes, sides["concurrent, prefix cache"](), prompts[:2], tool, True)  # warm-up
    best: dict[str, tuple[float, float]] = {}
    stats: dict[str, dict[str, float]] = {}
    outputs: dict[str, list[list[int]]] = {}
    started = time.perf_counter()
    for _ in range(args.repeats):
        for name, make in sides.items():
            sampler = make()
            wall, cpu = time.perf_counter(), time.process_time()
            outputs[name] = anyio.run(_episodes, sampler, prompts, tool, name != "one at a time")
            wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
            previous = best.get(name, (float("inf"), float("inf")))
            best[name] = (min(previous[0], wall), min(previous[1], cpu))
            stats[name] = sampler.metrics()
    total = time.perf_counter() - started
    reference = outputs["one at a time"]
    assert all(out == reference for out in outputs.values()), "the three ways generated different tokens"
    generated = sum(len(o) - len(p) - TURNS * len(tool) for o, p in zip(reference, prompts, strict=True))
    base_wall, base_cpu = best["one at a time"]
    rows = [
        f"| {name} | {wall:.2f} | {cpu:.2f} | {generated / wall:,.0f} | {stats[name]['sampler/prefill_tokens']:,.0f}"
        f" | {stats[name]['sampler/decode_rows_mean']:.1f} | {base_wall / wall:.1f}× | {base_cpu / cpu:.1f}× |"
        for name, (wall, cpu) in best.items()
    ]
    load = os.getloadavg()[0]
    now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    section = f"""## bench_hybrid

HFSampler on a Qwen3.5-style hybrid stand-in (random `Qwen3_5ForCausalLM`, hidden 128, 4 layers alternating
gated-delta-net linear attention and full attention, the embedded tiny tokenizer; transformers' reference PyTorch
kernels): {args.episodes} episodes of {TURNS} greedy turns ({NEW_TOKENS} new tokens, then a tool response), same
tokens on every side (checked). Best of {args.repeats}, sides alternating; CPU is process time over all threads.

- command: `uv run python benchmarks/bench_hybrid.py --episodes {args.episodes} --repeats {args.repeats}`
- date: {now}; wall {total:.0f} s; load average at the end {load:.1f}
- machine: {platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__} ({torch.get_num_threads()} threads),
  Python {platform.python_version()}

| side | wall (s) | CPU (s) | tokens / s | prefill tokens | rows per decode step | wall vs one at a time | CPU vs one at a time |
|---|---:|---:|---:|---:|---:|---:|---:|
{chr(10).join(rows)}
"""
    replace_section(section)
    print(section)


if __name__ == "__main__":
    main()
