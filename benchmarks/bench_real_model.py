"""The real pretrained model on this CPU: decode, update and a GRPO step, each against its bf16 FLOP bound.

The model is the ``cpu-smollm2`` profile's (SmolLM2-135M-Instruct, `mcprl_policy.fetch_pinned_model`; or
``--model DIR``, e.g. a warm-started checkpoint's ``policy`` directory), in the profile's precision (bf16-mixed:
float32 master weights, bf16 matmuls). The prompts are held-out tasks of ``preset:default`` rendered by the
model's own chat template with the tool schemas each task's servers offer (the bundled offline servers, started
over stdio as a run starts them), so the prompts are the run's first turns.

Measured in one run, sides alternated, best of ``--repeats``:

- ``real_decode_tok_s``: `HFSampler` (the sampler a run uses: dynamic batching, prefix cache, lean decode),
  ``--rows`` prompts at once, greedy, ``env.max_new_tokens_per_turn`` new tokens each: generated tokens per
  second of wall-clock, prefill included.
- ``real_sampler_vs_hf_generate``: the same prompts through ``model.generate`` as a transformers user runs it
  (the model loaded with ``dtype=torch.bfloat16``, left padding, one batch, greedy, the same new-token cap,
  stopping at ``<|im_end|>``): its wall-clock over the sampler's. Both configurations are printed.
- ``real_update_tok_s``: forward and backward of the sampled sequences (prompt and completion) through the
  learner's backend in the profile's layout and micro-batch size: trained tokens per second.
- each beside its FLOP-bound time: 2 · (matmul parameters) · tokens forward, x3 with backward, at this
  machine's bf16 matmul rate measured in the same run (a 2048³ ``torch.mm`` in bfloat16 on one core's CPU
  time, times the torch threads).
- ``real_grpo_step_s`` (with ``--grpo-steps N``): ``mcprl-train --profile cpu-smollm2`` from ``--model`` for N
  GRPO steps of ``grpo.tasks_per_step`` x ``grpo.group_size`` episodes, no warm start, collected then learned;
  the mean ``perf/step_s`` of its ``metrics.jsonl``.

    uv run python benchmarks/bench_real_model.py [--model DIR] [--rows 64] [--repeats 2] [--grpo-steps 2]

On a shared machine set ``OMP_NUM_THREADS=1`` (OpenMP threads spinning against other processes' threads
inflate every number); the load average is printed.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import anyio
import torch
from transformers import AutoModelForCausalLM, PreTrainedTokenizerBase
from transformers.integrations.sdpa_attention import repeat_kv

from mcprl_env.loaders import iter_tasks
from mcprl_policy import HFSampler, Policy, SamplingParams, fetch_pinned_model
from mcprl_policy.attention import decode_sdpa
from mcprl_servers.config import default_servers_config
from mcprl_tools import ServersConfig, ToolManager
from mcprl_train.build import task_path
from mcprl_train.config import Config
from mcprl_train.loop.update import TorchBackend

PROFILE = "cpu-smollm2"


def bf16_peak_gflops(threads: int, *, repeats: int = 5) -> float:
    """bf16 ``torch.mm`` GFLOP/s of one core (2048³, best of ``repeats`` by thread CPU time), times ``threads``."""
    a = torch.randn(2048, 2048, dtype=torch.bfloat16)
    b = torch.randn(2048, 2048, dtype=torch.bfloat16)
    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        torch.mm(a, b)
        best = min(_thread_seconds(lambda: torch.mm(a, b)) for _ in range(repeats))
    finally:
        torch.set_num_threads(saved)
    return 2 * 2048**3 / best / 1e9 * threads


def _thread_seconds(fn: object) -> float:
    start = time.thread_time()
    fn()  # type: ignore[operator]
    return time.thread_time() - start


def decode_attention_ms(rows: int, length: int, config: object) -> tuple[float, float]:
    """One layer's decode attention at ``rows`` x ``length`` cached tokens, in the model's head layout: transformers'
    ``sdpa`` path (``repeat_kv`` copies for grouped heads, then SDPA with the mask) and `decode_sdpa` (the
    grouped kernel), ms of one core's CPU time, best of 5."""
    heads = int(config.num_attention_heads)  # type: ignore[attr-defined]
    kv_heads = int(config.num_key_value_heads)  # type: ignore[attr-defined]
    dim = int(config.hidden_size) // heads  # type: ignore[attr-defined]
    pool_k = torch.randn(rows, kv_heads, length + 64, dim)
    pool_v = torch.randn_like(pool_k)
    key, value = pool_k[:, :, 32 : 32 + length], pool_v[:, :, 32 : 32 + length]
    query = torch.randn(rows, heads, 1, dim)
    mask = torch.ones(rows, 1, 1, length, dtype=torch.bool)
    mask[0, ..., : length // 3] = False
    groups = heads // kv_heads

    def theirs() -> object:
        return torch.nn.functional.scaled_dot_product_attention(
            query, repeat_kv(key, groups), repeat_kv(value, groups), attn_mask=mask
        )

    def ours() -> object:
        return decode_sdpa(query, key, value, mask, scale=None, groups=groups)

    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        times = {f: float("inf") for f in (theirs, ours)}
        for _ in range(5):
            for f in (theirs, ours):
                times[f] = min(times[f], _thread_seconds(lambda f=f: [f() for _ in range(5)]) / 5)
    finally:
        torch.set_num_threads(saved)
    return times[theirs] * 1e3, times[ours] * 1e3


def matmul_params(model: torch.nn.Module) -> int:
    """Weights that take part in a matmul per token: every Linear, the output head included."""
    return sum(m.in_features * m.out_features for m in model.modules() if isinstance(m, torch.nn.Linear))


async def render_prompts(config: Config, tokenizer: PreTrainedTokenizerBase, rows: int) -> list[list[int]]:
    """The first turn of ``rows`` held-out tasks, each with its servers' tool schemas, as the run renders it."""
    spec = config.tasks.validation or config.tasks.train
    tasks = list(itertools.islice(iter_tasks(task_path(spec, name="validation")), rows))
    servers = ServersConfig.from_dict(
        default_servers_config(list(config.tools.source.names)),  # type: ignore[union-attr]
        source="bench_real_model",
    )
    prompts: list[list[int]] = []
    async with ToolManager(servers) as manager:
        for task in tasks:
            schemas = manager.tool_schemas(list(task.servers) if task.servers is not None else None)
            ids = tokenizer.apply_chat_template(
                task.initial_messages(),
                tools=list(schemas),  # pyright: ignore[reportArgumentType]
                tokenize=True,
                add_generation_prompt=True,
                return_dict=False,
            )
            prompts.append([int(t) for t in ids])  # type: ignore[union-attr]
    return prompts


def sampler_side(policy: Policy, prompts: list[list[int]], new_tokens: int) -> tuple[float, list[list[int]]]:
    """Wall-clock of the sampler on every prompt at once, and the completions."""
    sampler = HFSampler(policy, SamplingParams(temperature=0.0), max_batch_size=len(prompts), max_wait_ms=5)
    out: list[list[int]] = [[] for _ in prompts]

    async def run() -> None:
        async def one(i: int) -> None:
            out[i] = (await sampler.sample(prompts[i], max_new_tokens=new_tokens)).token_ids

        async with anyio.create_task_group() as tg:
            for i in range(len(prompts)):
                tg.start_soon(one, i)

    start = time.perf_counter()
    anyio.run(run)
    return time.perf_counter() - start, out


def generate_side(
    model: torch.nn.Module, tokenizer: PreTrainedTokenizerBase, prompts: list[list[int]], new_tokens: int
) -> tuple[float, int]:
    """Wall-clock of ``model.generate`` on the prompts as one left-padded batch, and the tokens it generated
    up to each row's end of turn."""
    tokenizer.padding_side = "left"
    batch = tokenizer.pad({"input_ids": prompts}, return_tensors="pt")
    eos_id = tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert isinstance(eos_id, int)
    eos = eos_id
    start = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(  # type: ignore[operator]
            **batch, max_new_tokens=new_tokens, do_sample=False, eos_token_id=eos, pad_token_id=eos
        )
    wall = time.perf_counter() - start
    generated = 0
    for row in out[:, batch["input_ids"].shape[1] :].tolist():
        generated += row.index(eos) + 1 if eos in row else len(row)
    return wall, generated


def update_side(policy: Policy, config: Config, sequences: list[list[int]]) -> float:
    """Wall-clock of forward + backward of ``sequences`` through the learner's backend (the profile's layout
    and micro-batches), gradients dropped after."""
    backend = TorchBackend(policy, config.optim)
    budget = config.optim.micro_batch_tokens
    batches: list[list[list[int]]] = [[]]
    for seq in sequences:
        if batches[-1] and sum(map(len, batches[-1])) + len(seq) > budget:
            batches.append([])
        batches[-1].append(seq)
    start = time.perf_counter()
    for batch in batches:
        out = backend.forward(batch, temperature=1.0, values=False)
        backend.backward(out.logprobs.sum())
    wall = time.perf_counter() - start
    policy.model.zero_grad(set_to_none=True)
    return wall


def grpo_steps(model: str, steps: int) -> list[float]:
    """``perf/step_s`` of ``steps`` GRPO steps of the profile run from ``model`` (no warm start)."""
    with tempfile.TemporaryDirectory(prefix="bench-real-") as tmp:
        sets = [
            f"model.name={model}",
            "sft.enabled=false",
            f"run.steps={steps}",
            "eval.every=0",
            "eval.n_tasks=8",
            "run.checkpoint_every=0",
            f"run.output_dir={tmp}",
            "run.name=grpo",
            "tracking.wandb=disabled",
            "tracking.progress=false",
        ]
        command = [sys.executable, "-m", "mcprl_train", "train", "--profile", PROFILE]
        for s in sets:
            command += ["--set", s]
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise SystemExit(f"the GRPO run failed:\n{done.stderr[-3000:]}")
        records = [json.loads(line) for line in (Path(tmp) / "grpo" / "metrics.jsonl").open()]
    return [float(r["perf/step_s"]) for r in records if r.get("kind") == "grpo" and "perf/step_s" in r]


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--model", default=None, help="a model directory (default: the profile's model)")
    parser.add_argument("--rows", type=int, default=64, help="prompts decoded at once (>= 64 for the bar)")
    parser.add_argument("--repeats", type=int, default=2, help="runs of each side (best kept)")
    parser.add_argument("--grpo-steps", type=int, default=0, help="GRPO steps timed (0: skip)")
    args = parser.parse_args()

    config = Config.load(profile=PROFILE)
    model_dir = args.model or str(fetch_pinned_model(config.model.name))
    threads = torch.get_num_threads()
    print(
        f"model {model_dir}; torch {torch.__version__}, {threads} threads; "
        f"load average {os.getloadavg()[0]:.1f} (2 cores)"
    )
    policy = Policy.from_pretrained(model_dir, value_head=False, dtype=config.model.dtype)
    hf_model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16).eval()
    tokenizer = policy.tokenizer
    new_tokens = config.env.max_new_tokens_per_turn
    prompts = anyio.run(render_prompts, config, tokenizer, args.rows)
    prompt_tokens = sum(map(len, prompts))
    print(
        f"prompts: {len(prompts)} held-out tasks of {config.tasks.validation}, {prompt_tokens} tokens "
        f"({prompt_tokens / len(prompts):.0f} per prompt), up to {new_tokens} new tokens each, greedy"
    )
    print(
        f"mcprl: HFSampler(max_batch_size={len(prompts)}, max_wait_ms=5), precision {policy.precision}, "
        "all prompts submitted at once"
    )
    print(
        "transformers: AutoModelForCausalLM.from_pretrained(dtype=torch.bfloat16).generate(left-padded batch, "
        f"do_sample=False, max_new_tokens={new_tokens}, eos <|im_end|>)"
    )
    ours, theirs = float("inf"), float("inf")
    completions: list[list[int]] = []
    theirs_tokens = 0
    for _ in range(args.repeats):
        wall, completions = sampler_side(policy, prompts, new_tokens)
        ours = min(ours, wall)
        wall, theirs_tokens = generate_side(hf_model, tokenizer, prompts, new_tokens)
        theirs = min(theirs, wall)
    generated = sum(map(len, completions))
    peak = bf16_peak_gflops(threads)
    n_matmul = matmul_params(policy.model)
    decode_bound = 2 * n_matmul * (prompt_tokens + generated) / (peak * 1e9)
    print(
        f"bf16 matmul peak: {peak:.0f} GFLOP/s ({threads} threads); matmul parameters {n_matmul / 1e6:.1f} M"
    )
    print(
        f"sampler: {generated} tokens in {ours:.2f} s; FLOP bound (prefill + decode) {decode_bound:.2f} s "
        f"({ours / decode_bound:.0f}x)"
    )
    print(f"generate: {theirs_tokens} tokens in {theirs:.2f} s")
    print(f"real_decode_tok_s: {generated / ours:.1f}")
    print(f"real_sampler_vs_hf_generate: {theirs / ours:.2f}")

    sequences = [p + c for p, c in zip(prompts, completions, strict=True)]
    trained = sum(map(len, sequences))
    learn = min(update_side(policy, config, sequences) for _ in range(args.repeats))
    update_bound = 3 * 2 * n_matmul * trained / (peak * 1e9)
    print(
        f"update: {trained} tokens forward + backward in {learn:.2f} s; FLOP bound {update_bound:.2f} s "
        f"({learn / update_bound:.0f}x)"
    )
    print(f"real_update_tok_s: {trained / learn:.1f}")
    length = round(trained / len(sequences))
    theirs_ms, ours_ms = decode_attention_ms(len(prompts), length, policy.model.config)
    print(
        f"decode attention, one layer, {len(prompts)} rows x {length} cached tokens: transformers' sdpa "
        f"(repeat_kv) {theirs_ms:.2f} ms, decode_sdpa {ours_ms:.2f} ms"
    )
    print(f"decode_attention_speedup: {theirs_ms / ours_ms:.2f}")
    if args.grpo_steps > 0:
        steps = grpo_steps(model_dir, args.grpo_steps)
        print(f"GRPO steps: {', '.join(f'{s:.1f}' for s in steps)} s")
        print(f"real_grpo_step_s: {sum(steps) / len(steps):.1f}")


if __name__ == "__main__":
    main()
