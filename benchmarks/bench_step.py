"""Where a demo GRPO step's time goes: the cpu profile's step, phase by phase, against its FLOP-bound time.

Builds the demo exactly as ``mcprl-train`` does (the ``cpu`` profile, the three offline MCP servers over stdio,
the HF sampler with its prefix cache, the profile's update layout) through `mcprl_train.loop.trainer.Trainer`,
runs one greedy evaluation (``eval.n_tasks`` held-out tasks, the trainer's step-0 evaluation) and ``--steps``
GRPO steps with collection and update one after the other (``collection.overlap=false``, so that each phase is
timed alone), and reports per phase:

- collection: the decode engine's decode steps and prefills (admission: prefill forward, cache gather and
  merge), the rest of the engine thread (dropping rows, the prefix-cache check), tool calls (summed latency of
  `ToolManager.call`, overlapped with decoding; the servers' own CPU time), and the event loop's thread CPU
  time (episodes, parsing, rewards, tokenizer, MCP client JSON);
- the update: forward, backward, optimizer step (`UpdateBackend`), and the rest of `Learner.update`;
- the evaluation.

Phases are timed by wrapping the engine's, manager's and backend's own methods (a deterministic profiler: the
same calls run, in the same order). Each phase shows wall-clock, CPU time (the process's while the phase
runs, so decode/prefill include the event loop's concurrent work; the main thread's for the event loop; the
server processes' for tools), and for decode, prefill and the update the FLOP-bound time of the same work:
2 · (matmul parameters) · tokens forward, x3 with backward, at this machine's matmul GFLOP/s measured in the
same run on the model's own shapes by one core's CPU time, times the torch threads (attention's T² term is
left out: it is small at these lengths and not a weight matmul). The last column, CPU / threads / bound, is
how far the phase is from its arithmetic, whatever else loads the machine. Then one decode step at the
step's shape split into attention, KV-cache concatenation, weight matmuls and the rest, and the seeded draw
of one decode step. When the profile overlaps collection and update (``collection.overlap``), a second run
then times ``--steps`` steps as the profile runs them, each update beside the next step's collection
(`overlapped_steps`): that is the headline. On a shared machine run it with ``OMP_NUM_THREADS=1`` (threads
spinning against other processes' threads inflate both clocks).

    uv run python benchmarks/bench_step.py [--checkpoint outputs/RUN] [--steps 3] [--skip-steps 0] [--eval-tasks 400]

``--checkpoint`` starts from a run's latest checkpoint (e.g. one after the warm start:
``uv run mcprl-train --run-name warm --set run.steps=0``); without it the freshly built model (untrained: its
episodes run to the token limit, so the step is not the demo's). Prints ``demo_grpo_step_s: X`` (the mean
GRPO step's wall-clock, as the profile runs it) on its own line.
"""

from __future__ import annotations

import argparse
import functools
import gc
import os
import platform
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ParamSpec, TypeVar

import psutil
import structlog
import torch

from mcprl_policy import HFSampler
from mcprl_policy.decode import DecodeEngine
from mcprl_policy.prefix_grouped import computed_tokens, prefix_groups
from mcprl_tools import ToolManager
from mcprl_train import build
from mcprl_train.config import Config
from mcprl_train.loop.learner import Learner
from mcprl_train.loop.trainer import Trainer
from mcprl_train.loop.update import TorchBackend
from mcprl_train.run.run_dir import RunDir, open_checkpoint

P = ParamSpec("P")
R = TypeVar("R")


@dataclass
class Phase:
    """Accumulated wall-clock and CPU seconds of one phase, with its call count and tokens."""

    wall: float = 0.0
    cpu: float = 0.0
    calls: int = 0
    tokens: int = 0


@dataclass
class Meter:
    """Phase totals since the last `reset` (one GRPO step or one evaluation)."""

    phases: dict[str, Phase] = field(default_factory=dict)

    def reset(self) -> dict[str, Phase]:
        out, self.phases = self.phases, {}
        return out

    def add(self, name: str, wall: float, cpu: float, tokens: int = 0) -> None:
        p = self.phases.setdefault(name, Phase())
        p.wall += wall
        p.cpu += cpu
        p.calls += 1
        p.tokens += tokens


METER = Meter()


def timed(
    name: str,
    fn: Callable[P, R],
    *,
    clock: Callable[[], float] = time.thread_time,
    tokens: Callable[[R], int] | None = None,
) -> Callable[P, R]:
    """``fn`` that adds its wall-clock and ``clock`` seconds (and ``tokens(result)``) to `METER`'s ``name``."""

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        w, c = time.perf_counter(), clock()
        result = fn(*args, **kwargs)
        METER.add(name, time.perf_counter() - w, clock() - c, tokens(result) if tokens else 0)
        return result

    return wrapper


def instrument() -> None:
    """Wrap the engine's decode step and admission, the engine loop, the backend's update calls."""
    for owner, attr in (
        (DecodeEngine, "_decode_step"),
        (DecodeEngine, "_admit"),
        (DecodeEngine, "run_until_finished"),
        (TorchBackend, "forward"),
        (TorchBackend, "backward"),
        (TorchBackend, "step"),
        (Learner, "update"),
    ):
        if not callable(getattr(owner, attr, None)):
            raise SystemExit(f"bench_step: {owner.__name__}.{attr} is gone; update the bench's phases")
    decode = DecodeEngine._decode_step  # pyright: ignore[reportPrivateUsage]
    admit = DecodeEngine._admit  # pyright: ignore[reportPrivateUsage]

    def decode_step(self: DecodeEngine, device: torch.device) -> list[object]:
        rows = len(self.active)
        w, c = time.perf_counter(), time.process_time()
        out = decode(self, device)
        METER.add("decode", time.perf_counter() - w, time.process_time() - c, rows)
        return list(out)

    def admit_step(self: DecodeEngine, new: list[object], device: torch.device) -> list[object]:
        before, shared = self.stats.prefill_tokens, self.stats.shared_tokens
        w, c = time.perf_counter(), time.process_time()
        out = admit(self, new, device)  # pyright: ignore[reportArgumentType]
        METER.add(
            "prefill", time.perf_counter() - w, time.process_time() - c, self.stats.prefill_tokens - before
        )
        METER.add("shared_prefill", 0.0, 0.0, self.stats.shared_tokens - shared)
        return list(out)

    DecodeEngine._decode_step = decode_step  # pyright: ignore[reportAttributeAccessIssue]
    DecodeEngine._admit = admit_step  # pyright: ignore[reportAttributeAccessIssue]
    DecodeEngine.run_until_finished = timed(
        "engine", DecodeEngine.run_until_finished, clock=time.process_time
    )
    TorchBackend.forward = timed("forward", TorchBackend.forward, clock=time.process_time)
    forward = TorchBackend.forward

    def counted_forward(self: TorchBackend, sequences: Any, **kwargs: Any) -> Any:
        lens = [len(s) for s in sequences]
        match self.layout:
            case "padded":
                computed = len(lens) * max(lens, default=0)
            case "prefix_grouped":  # each group's prefix once (the length buckets' padding left out)
                computed = sum(
                    computed_tokens([lens[m] for m in g.members], g.shared) for g in prefix_groups(sequences)
                )
            case _:
                computed = sum(lens)
        METER.add("train_rows", 0.0, 0.0, computed)
        return forward(self, sequences, **kwargs)

    TorchBackend.forward = counted_forward  # pyright: ignore[reportAttributeAccessIssue]
    TorchBackend.backward = timed("backward", TorchBackend.backward, clock=time.process_time)
    TorchBackend.step = timed("optimizer", TorchBackend.step, clock=time.process_time)
    Learner.update = timed("update", Learner.update, clock=time.process_time)
    call = ToolManager.call

    async def tool_call(self: ToolManager, *args: object, **kwargs: object) -> object:
        w = time.perf_counter()
        result = await call(self, *args, **kwargs)  # pyright: ignore[reportArgumentType]
        METER.add("tools", time.perf_counter() - w, 0.0)
        return result

    ToolManager.call = tool_call  # pyright: ignore[reportAttributeAccessIssue]


def watch_gc() -> None:
    """Add every cyclic garbage collection's pause (all generations) to `METER`'s ``gc``."""
    started: list[tuple[float, float]] = []

    def callback(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            started.append((time.perf_counter(), time.thread_time()))
        elif started:
            w, c = started.pop()
            METER.add("gc", time.perf_counter() - w, time.thread_time() - c, info.get("collected", 0))

    gc.callbacks.append(callback)


def servers_cpu() -> float:
    """CPU seconds (user + system) of this process's child processes so far (the MCP servers)."""
    total = 0.0
    for child in psutil.Process().children(recursive=True):
        try:
            t = child.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += t.user + t.system
    return total


@dataclass
class Mark:
    wall: float
    cpu: float
    main: float
    servers: float

    @classmethod
    def now(cls) -> Mark:
        return cls(time.perf_counter(), time.process_time(), time.thread_time(), servers_cpu())


@dataclass
class StepRecord:
    collect: tuple[Mark, Mark]
    learn: tuple[Mark, Mark]
    end: Mark
    collect_phases: dict[str, Phase]
    learn_phases: dict[str, Phase]
    metrics: dict[str, float]


class Recorder:
    """Trainer hooks: phase marks per GRPO step; stops the run after ``steps`` steps (before its final eval)."""

    def __init__(self, steps: int) -> None:
        self.steps = steps
        self.records: list[StepRecord] = []
        self.eval_phases: dict[str, Phase] = {}
        self.eval_marks: tuple[Mark, Mark] | None = None
        self._marks: dict[str, Mark] = {}
        self._collect: dict[str, Phase] = {}
        self._learn: dict[str, Phase] = {}

    def __call__(self, event: str, trainer: Trainer) -> None:
        now = Mark.now()
        self._marks[event] = now
        match event:
            case "before_rollout":
                METER.reset()
            case "after_rollout":
                self._collect = METER.reset()
            case "after_update":
                self._learn = METER.reset()
            case "after_step":
                m = self._marks
                self.records.append(
                    StepRecord(
                        collect=(m["before_rollout"], m["after_rollout"]),
                        learn=(m["after_rollout"], m["after_update"]),
                        end=now,
                        collect_phases=self._collect,
                        learn_phases=self._learn,
                        metrics=dict(trainer.history[-1]),
                    )
                )
                if len(self.records) >= self.steps:
                    raise _Done
            case _:
                pass

    def watch_evaluation(self) -> None:
        """Time `Trainer.evaluate` (the step-0 evaluation: the first one only)."""
        evaluate = Trainer.evaluate

        async def timed_evaluate(trainer: Trainer, tag: str) -> dict[str, float]:
            METER.reset()
            start = Mark.now()
            out = await evaluate(trainer, tag)
            if self.eval_marks is None:
                self.eval_marks = (start, Mark.now())
                self.eval_phases = METER.reset()
            return out

        Trainer.evaluate = timed_evaluate  # pyright: ignore[reportAttributeAccessIssue]


class _Done(Exception):
    """Raised by the recorder to end the run after the measured steps."""


def matmul_params(model: torch.nn.Module) -> tuple[int, list[tuple[int, int]]]:
    """Parameters that take part in a matmul per token (every Linear, the output head included) and their shapes."""
    shapes = [
        (int(m.in_features), int(m.out_features)) for m in model.modules() if isinstance(m, torch.nn.Linear)
    ]
    return sum(i * o for i, o in shapes), shapes


def matmul_gflops(
    shapes: list[tuple[int, int]], rows: int, *, repeats: int = 5, dtype: torch.dtype = torch.float32
) -> float:
    """GFLOP/s of one core on ``(rows, in) @ (in, out)`` over the model's Linear shapes, in ``dtype`` (the
    dtype the path computes in: bfloat16 under bf16-mixed, where these CPUs' AMX units do the matmuls).

    One torch thread, timed by its thread CPU time (best of ``repeats``), so that other processes on a loaded
    machine do not count; the FLOP-bound times scale it by the run's torch threads.
    """
    rows = max(1, rows)
    xs = [(torch.randn(rows, i, dtype=dtype), torch.randn(i, o, dtype=dtype)) for i, o in shapes]
    flops = sum(2 * rows * i * o for i, o in shapes)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    best = float("inf")
    try:
        for _ in range(repeats):
            t = time.thread_time()
            for _ in range(10):
                for a, b in xs:
                    torch.mm(a, b)
            best = min(best, (time.thread_time() - t) / 10)
    finally:
        torch.set_num_threads(threads)
    return flops / best / 1e9


def thread_ms(fn: Callable[[], object], *, n: int = 20, repeats: int = 5) -> float:
    """Best-of-``repeats`` thread CPU milliseconds of one ``fn()`` (one torch thread)."""
    best = float("inf")
    for _ in range(repeats):
        t = time.thread_time()
        for _ in range(n):
            fn()
        best = min(best, (time.thread_time() - t) / n)
    return best * 1e3


def decode_anatomy(model: torch.nn.Module, rows: int, length: int) -> list[str]:
    """One decode step of ``rows`` rows over ``length`` cached tokens, split: the whole forward, its attention
    (SDPA), the KV-cache concatenation (`DynamicLayer.update`), its weight matmuls; one torch thread."""
    from transformers import DynamicCache

    cfg: Any = model.config
    layers, heads = int(cfg.num_hidden_layers), int(cfg.num_key_value_heads)
    head_dim = int(getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads)
    q_heads = int(cfg.num_attention_heads)
    _, shapes = matmul_params(model)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with torch.inference_mode():
            ids = torch.randint(5, 200, (rows, length))
            mask = torch.ones(rows, length + 1, dtype=torch.long)
            cache = DynamicCache(config=cfg)
            model(input_ids=ids, attention_mask=mask[:, :-1], past_key_values=cache, use_cache=True)
            last, pos = ids[:, -1:], torch.full((rows, 1), length)
            cache_layers: list[Any] = list(cache.layers)
            keys = [(layer.keys, layer.values) for layer in cache_layers]

            def step() -> None:
                for layer, (k, v) in zip(cache_layers, keys, strict=True):
                    layer.keys, layer.values = k, v  # the same cache length every time
                model(
                    input_ids=last,
                    attention_mask=mask,
                    position_ids=pos,
                    past_key_values=cache,
                    use_cache=True,
                )

            whole = thread_ms(step)
            q = torch.randn(rows, q_heads, 1, head_dim)
            k = torch.randn(rows, heads, length + 1, head_dim)
            bool_mask = torch.ones(rows, 1, 1, length + 1, dtype=torch.bool)
            sdpa = layers * thread_ms(
                lambda: torch.nn.functional.scaled_dot_product_attention(
                    q, k, k, attn_mask=bool_mask, enable_gqa=q_heads != heads
                )
            )
            new = torch.randn(rows, heads, 1, head_dim)
            cat = 2 * layers * thread_ms(lambda: torch.cat([k[:, :, :-1], new], dim=-2))
            xs = [(torch.randn(rows, i), torch.randn(i, o)) for i, o in shapes]
            mm = thread_ms(lambda: [torch.mm(a, b) for a, b in xs])
    finally:
        torch.set_num_threads(threads)
    rest = whole - sdpa - cat - mm
    return [
        f"one decode step, {rows} rows x {length} cached tokens, one thread (thread CPU, best of 5): "
        f"{whole:.2f} ms = attention (SDPA) {sdpa:.2f} + KV-cache concatenation {cat:.2f} + weight matmuls "
        f"{mm:.2f} + the rest (Python, norms, rotary, mask) {rest:.2f}",
    ]


def layout_cost(model: torch.nn.Module, rows: int, length: int, *, steps: int = 20) -> str:
    """Thread CPU of one engine decode step (`RunningCache.step`: mask, forward, cache write) with the
    concatenated ``DynamicCache``, with the preallocated `KVPool`, and with the pool and the lean forward
    (`mcprl_policy.lean_decode`, where the model is supported), ``rows`` ragged rows (row ``i`` has
    ``length - i % 32`` tokens, left-padded) decoding ``steps`` steps from ``length``; best of 5 (the three
    alternating), one thread."""
    from transformers import DynamicCache

    from mcprl_policy.batch_cache import ConcatCache, Forward, RunningCache
    from mcprl_policy.kv_pool import KVPool
    from mcprl_policy.lean_decode import LeanDecoder, lean_unsupported_reason

    pads = [i % 32 for i in range(rows)]
    ids = torch.randint(5, 200, (rows, length))
    mask = torch.tensor([[0] * p + [1] * (length - p) for p in pads])
    start = mask.sum(-1)

    def forward(**kwargs: Any) -> Any:
        return model(**kwargs, use_cache=True, logits_to_keep=1)

    def fresh(layout: RunningCache) -> RunningCache:
        cache = DynamicCache(config=getattr(model, "config", None))
        forward(
            input_ids=ids,
            attention_mask=mask,
            position_ids=(mask.cumsum(-1) - 1).clamp(min=0),
            past_key_values=cache,
        )
        layout.merge(cache, mask)
        return layout

    refused = lean_unsupported_reason(model, "pool")
    forwards: dict[str, Forward] = {"concat": forward, "pool": forward}
    if refused is None:
        forwards["lean"] = LeanDecoder(model)
    best = dict.fromkeys(forwards, float("inf"))
    threads, training = torch.get_num_threads(), model.training
    torch.set_num_threads(1)
    model.eval()  # as the engine decodes
    try:
        with torch.inference_mode():
            for _ in range(5):
                for name in best:
                    running = fresh(
                        ConcatCache(ids.device)
                        if name == "concat"
                        else KVPool(max_rows=rows, device=ids.device)
                    )
                    last, positions = ids[:, -1], start
                    t = time.thread_time()
                    for _ in range(steps):
                        last = running.step(forwards[name], last, positions).argmax(-1)
                        positions = positions + 1
                    best[name] = min(best[name], (time.thread_time() - t) / steps)
    finally:
        torch.set_num_threads(threads)
        model.train(training)
    concat, pool = best["concat"] * 1e3, best["pool"] * 1e3
    lean = (
        f"{best['lean'] * 1e3:.2f} ms KV pool + lean forward ({pool / (best['lean'] * 1e3):.2f}x the pool's)"
        if "lean" in best
        else f"no lean forward ({refused})"
    )
    return (
        f"engine decode step, {rows} ragged rows x {length} cached tokens, one thread (thread CPU, best of 5 x "
        f"{steps} steps): {concat:.2f} ms concatenated DynamicCache, {pool:.2f} ms KV pool "
        f"({concat / pool:.2f}x), {lean}"
    )


def draw_cost(engine: DecodeEngine, rows: int, vocab: int) -> str:
    """Thread CPU of drawing one token for ``rows`` seeded rows: the engine's batched race vs one
    ``torch.multinomial`` per row (the engine's earlier way; the same tokens, `test_seeded_draws.py`)."""
    from mcprl_policy.decode import DecodeRequest

    probs = torch.randn(rows, vocab).mul(4.0).softmax(-1)
    requests = [DecodeRequest(prompt_ids=[1], max_new_tokens=1, seed=i) for i in range(rows)]
    generators = [torch.Generator().manual_seed(i) for i in range(rows)]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        batched = thread_ms(lambda: engine.chooser.draw(probs, requests))  # pyright: ignore[reportPrivateUsage]
        per_row = thread_ms(
            lambda: [torch.multinomial(probs[i : i + 1], 1, generator=g) for i, g in enumerate(generators)]
        )
    finally:
        torch.set_num_threads(threads)
    return (
        f"seeded draw of one decode step ({rows} rows, {vocab} ids), one thread: {batched:.2f} ms batched "
        f"(the engine), {per_row:.2f} ms as one multinomial per row"
    )


def fmt_row(name: str, wall: float, cpu: float | None, note: str = "", bound: float | None = None) -> str:
    cpu_s = "–" if cpu is None else f"{cpu:.2f}"
    bound_s = "–" if bound is None else f"{bound:.3f}"
    per_thread = None if cpu is None else cpu / torch.get_num_threads()
    ratio = "–" if bound is None or bound <= 0 or per_thread is None else f"{per_thread / bound:.0f}x"
    return f"| {name} | {wall:.2f} | {cpu_s} | {bound_s} | {ratio} | {note} |"


def config_for(args: argparse.Namespace, output_dir: Path) -> Config:
    """The phase run's config: the cpu profile with ``--set``, collection and update one after the other."""
    overrides = [
        "sft.enabled=false",
        f"run.steps={args.skip_steps + args.steps + 1}",
        "eval.every=0",
        f"eval.n_tasks={args.eval_tasks}",
        "run.checkpoint_every=0",
        f"run.output_dir={output_dir}",
        "run.name=bench-step",
        "tracking.progress=false",
        *args.set,
        "collection.overlap=false",  # the phases are timed one at a time
    ]
    return Config.load(profile=args.profile, overrides=overrides)


class _StopAfter:
    """Trainer hook: end the run after ``steps`` GRPO steps."""

    def __init__(self, steps: int) -> None:
        self.steps = steps

    def __call__(self, event: str, trainer: Trainer) -> None:
        if event == "after_step" and trainer.state.step >= self.steps:
            raise _Done


def overlapped_steps(args: argparse.Namespace, policy_dir: str | None, output_dir: Path) -> list[float]:
    """The wall-clock of ``--steps`` GRPO steps run as the profile runs them, with ``collection.overlap``.

    Step 1 collects on its own and the last step of a run only learns, so the run goes on one step past the
    measured ones and step 1 is left out: each measured step is one update beside the next step's collection.
    No evaluation (no validation tasks).
    """
    overrides = [
        "sft.enabled=false",
        f"run.steps={args.skip_steps + args.steps + 2}",
        "eval.every=0",
        "run.checkpoint_every=0",
        f"run.output_dir={output_dir}",
        "run.name=bench-step-overlapped",
        "tracking.progress=false",
        *args.set,
    ]
    config = Config.load(profile="cpu", overrides=overrides)
    train, _ = build.load_tasks(config)
    trainer = Trainer(
        config,
        RunDir.create(config),
        backend=lambda _: build.torch_backend(config, source=policy_dir),
        tasks=(train, []),
        hooks=(_StopAfter(1 + args.skip_steps + args.steps),),
    )
    try:
        trainer.run()
    except* _Done:
        pass
    steps = [r for r in trainer.history if r["kind"] == "grpo"]
    return [float(r["perf/step_s"]) for r in steps[1 + args.skip_steps :]]


def report(args: argparse.Namespace, rec: Recorder, trainer: Trainer, source: str, load0: float) -> float:
    """Print the phase table and the decode anatomy; return the mean GRPO step's wall-clock."""
    model = trainer.policy.model
    n_matmul, shapes = matmul_params(model)
    skipped, steps = rec.records[: args.skip_steps], rec.records[args.skip_steps :]
    n = len(steps)

    def mean_phase(which: str, name: str) -> Phase:
        ps = [getattr(r, which).get(name, Phase()) for r in steps]
        return Phase(
            wall=sum(p.wall for p in ps) / n,
            cpu=sum(p.cpu for p in ps) / n,
            calls=round(sum(p.calls for p in ps) / n),
            tokens=round(sum(p.tokens for p in ps) / n),
        )

    def mean(f: Callable[[StepRecord], float]) -> float:
        return sum(f(r) for r in steps) / n

    decode = mean_phase("collect_phases", "decode")
    prefill = mean_phase("collect_phases", "prefill")
    shared = mean_phase("collect_phases", "shared_prefill")
    engine = mean_phase("collect_phases", "engine")
    tools = mean_phase("collect_phases", "tools")
    forward = mean_phase("learn_phases", "forward")
    backward = mean_phase("learn_phases", "backward")
    optimizer = mean_phase("learn_phases", "optimizer")
    update = mean_phase("learn_phases", "update")
    train_rows = mean_phase("learn_phases", "train_rows")
    gc_collect, gc_learn = mean_phase("collect_phases", "gc"), mean_phase("learn_phases", "gc")
    gc_step = Phase(
        wall=gc_collect.wall + gc_learn.wall,
        cpu=gc_collect.cpu + gc_learn.cpu,
        calls=gc_collect.calls + gc_learn.calls,
        tokens=gc_collect.tokens + gc_learn.tokens,
    )
    rows_decode = decode.tokens / max(1, decode.calls)
    rows_prefill = prefill.tokens / max(1, prefill.calls)
    train_tokens = mean(lambda r: r.metrics.get("perf/train_tokens", 0.0))
    precision = trainer.policy.precision
    dtype = torch.bfloat16 if precision.mixed and precision.dtype == "bfloat16" else torch.float32
    threads = torch.get_num_threads()
    g_decode = matmul_gflops(shapes, round(rows_decode), dtype=dtype) * threads
    g_prefill = matmul_gflops(shapes, round(rows_prefill), dtype=dtype) * threads
    g_update = matmul_gflops(shapes, trainer.config.optim.micro_batch_tokens, dtype=dtype) * threads

    collect_wall = mean(lambda r: r.collect[1].wall - r.collect[0].wall)
    collect_cpu = mean(lambda r: r.collect[1].cpu - r.collect[0].cpu)
    main_cpu = mean(lambda r: r.collect[1].main - r.collect[0].main)
    servers = mean(lambda r: r.collect[1].servers - r.collect[0].servers)
    learn_wall = mean(lambda r: r.learn[1].wall - r.learn[0].wall)
    learn_cpu = mean(lambda r: r.learn[1].cpu - r.learn[0].cpu)
    tail_wall = mean(lambda r: r.end.wall - r.learn[1].wall)
    step_wall = mean(lambda r: r.end.wall - r.collect[0].wall)
    step_cpu = mean(lambda r: r.end.cpu - r.collect[0].cpu)
    engine_rest = engine.wall - decode.wall - prefill.wall

    lines = [
        f"model: {trainer.config.model.name} ({source}); {n_matmul:,} matmul parameters; "
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, {os.cpu_count()} cores, "
        f"{platform.machine()}; load average {load0:.1f} at the start, {os.getloadavg()[0]:.1f} at the end",
        f"matmul GFLOP/s on the model's Linear shapes (one core's, by its CPU time, x threads): {g_decode:.1f} at {rows_decode:.0f} rows (decode), "
        f"{g_prefill:.1f} at {rows_prefill:.0f} rows (prefill), {g_update:.1f} at "
        f"{trainer.config.optim.micro_batch_tokens} rows (update)",
        *(
            f"left out of the means: GRPO step {i + 1}, update {r.learn[1].wall - r.learn[0].wall:.2f} s wall, "
            f"{r.learn[1].cpu - r.learn[0].cpu:.2f} s CPU; step {r.end.wall - r.collect[0].wall:.2f} s wall"
            for i, r in enumerate(skipped)
        ),
        f"GRPO steps measured: {n}; per step: {decode.calls} decode calls of {rows_decode:.0f} rows, "
        f"{prefill.calls} prefills of {rows_prefill:.0f} tokens, {tools.calls} tool calls, "
        f"{train_tokens:.0f} trained tokens",
        "",
        "| phase (mean per GRPO step) | wall (s) | CPU (s) | FLOP-bound (s) | CPU / threads / bound | note |",
        "|---|---:|---:|---:|---:|---|",
        fmt_row("collection", collect_wall, collect_cpu, "CPU: this process's, all threads"),
        fmt_row(
            "  decode",
            decode.wall,
            decode.cpu,
            f"{decode.tokens} tokens",
            2 * n_matmul * decode.tokens / (g_decode * 1e9),
        ),
        fmt_row(
            "  prefill (+ cache gather, merge)",
            prefill.wall,
            prefill.cpu,
            f"{prefill.tokens} tokens (and {shared.tokens} copied from an identical prompt's prefill)",
            2 * n_matmul * prefill.tokens / (g_prefill * 1e9),
        ),
        fmt_row(
            "  engine, rest", engine_rest, engine.cpu - decode.cpu - prefill.cpu, "row drops, cache check"
        ),
        fmt_row(
            "  tool calls (overlapped)",
            tools.wall,
            servers,
            f"summed latency of {tools.calls} calls; CPU: the server processes",
        ),
        fmt_row(
            "  event loop (env, parsing, MCP client)",
            max(0.0, collect_wall - engine.wall),
            main_cpu,
            "wall: collection minus engine; CPU: the main thread",
        ),
        fmt_row(
            "update",
            learn_wall,
            learn_cpu,
            "Learner.update + weight sync",
            3 * 2 * n_matmul * train_tokens / (g_update * 1e9),
        ),
        fmt_row(
            "  forward",
            forward.wall,
            forward.cpu,
            f"{forward.calls} micro-batches, {train_rows.tokens} tokens computed for {train_tokens:.0f} "
            f"trained ({train_rows.tokens / max(1, train_tokens):.0%})",
        ),
        fmt_row("  backward", backward.wall, backward.cpu, ""),
        fmt_row("  optimizer", optimizer.wall, optimizer.cpu, "clip + AdamW"),
        fmt_row(
            "  update, rest",
            update.wall - forward.wall - backward.wall - optimizer.wall,
            update.cpu - forward.cpu - backward.cpu - optimizer.cpu,
            "packing, losses, metrics",
        ),
        fmt_row("metrics, trajectories", tail_wall, None, "sinks"),
        fmt_row(
            "garbage collection (any phase)",
            gc_step.wall,
            gc_step.cpu,
            f"{gc_step.calls} collections, {gc_step.tokens} objects freed",
        ),
        fmt_row("GRPO step", step_wall, step_cpu, ""),
    ]
    if rec.eval_marks is not None:
        e0, e1 = rec.eval_marks
        ev = rec.eval_phases
        ed, ep = ev.get("decode", Phase()), ev.get("prefill", Phase())
        lines.append(
            fmt_row(
                f"evaluation ({trainer.config.eval.n_tasks} greedy episodes)",
                e1.wall - e0.wall,
                e1.cpu - e0.cpu,
                f"decode {ed.wall:.2f} s ({ed.calls} calls), prefill {ep.wall:.2f} s, "
                f"event loop CPU {e1.main - e0.main:.2f} s, servers CPU {e1.servers - e0.servers:.2f} s",
            )
        )
    episodes = trainer.config.grpo.tasks_per_step * trainer.config.grpo.group_size
    mean_len = mean(lambda r: r.metrics["perf/tokens_per_s"] * r.metrics["perf/step_s"]) / episodes
    lines += ["", *decode_anatomy(model, round(rows_decode), max(16, round(mean_len)))]
    lines.append(f"(cache length: the mean episode's tokens, {mean_len:.0f})")
    lines.append(layout_cost(model, round(rows_decode), max(40, round(mean_len))))
    sampler = trainer.sampler
    if isinstance(sampler, HFSampler):
        config: Any = model.config
        vocab = trainer.policy.vocab_limit or int(config.vocab_size)
        lines.append(draw_cost(sampler.engine, round(rows_decode), vocab))
    print("\n".join(lines))
    return step_wall


def decode_shapes(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    """``--decode-shapes``: `layout_cost` at each shape on the checkpoint's model (or the config's, untrained)."""
    from mcprl_policy import Policy

    shapes: list[tuple[int, int]] = []
    for shape in args.decode_shapes:
        rows, _, length = str(shape).partition("x")
        if not (rows.isdigit() and length.isdigit() and int(rows) > 0 and int(length) >= 32):
            parser.error(f"--decode-shapes takes ROWSxTOKENS with ROWS >= 1 and TOKENS >= 32, got {shape!r}")
        shapes.append((int(rows), int(length)))
    with tempfile.TemporaryDirectory(prefix="bench-step-") as tmp:
        config = config_for(args, Path(tmp))
        name = config.model.name
        if args.checkpoint is not None:
            _, loaded = open_checkpoint(args.checkpoint)
            name = str(loaded.subdir("policy"))
        policy = Policy.from_pretrained(
            name, value_head=False, attn_implementation=config.model.attn_implementation
        )
        print(f"model: {name}; load average {os.getloadavg()[0]:.1f}; torch {torch.__version__}")
        for rows, length in shapes:
            print(layout_cost(policy.model.eval(), rows, length))


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--checkpoint", type=Path, default=None, help="a checkpoint or run directory")
    parser.add_argument("--profile", default="cpu", help="the shipped profile whose step is timed")
    parser.add_argument("--steps", type=int, default=3, help="GRPO steps measured")
    parser.add_argument("--eval-tasks", type=int, default=400, help="greedy evaluation episodes")
    parser.add_argument(
        "--skip-steps",
        type=int,
        default=0,
        help="GRPO steps run first and left out of the means (their update time printed: a compile's)",
    )
    parser.add_argument("--set", action="append", default=[], help="extra config override key=value")
    parser.add_argument(
        "--decode-shapes",
        nargs="+",
        default=None,
        metavar="ROWSxTOKENS",
        help="only time the engine's decode step (layout_cost) at these shapes, e.g. 46x134 73x220, and exit",
    )
    args = parser.parse_args()
    if args.steps < 1:
        parser.error("--steps must be >= 1")
    if args.skip_steps < 0:
        parser.error("--skip-steps must be >= 0")
    if args.decode_shapes is not None:
        decode_shapes(args, parser)
        return
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(30))
    load0 = os.getloadavg()[0]
    instrument()
    watch_gc()
    with tempfile.TemporaryDirectory(prefix="bench-step-") as tmp:
        config = config_for(args, Path(tmp))
        if args.checkpoint is not None:
            _, loaded = open_checkpoint(args.checkpoint)
            policy_dir = str(loaded.subdir("policy"))
            source = f"checkpoint {loaded.path}"
        else:
            policy_dir = None
            source = "freshly built, untrained"
        rec = Recorder(args.skip_steps + args.steps)
        trainer = Trainer(
            config,
            RunDir.create(config),
            backend=lambda _: build.torch_backend(config, source=policy_dir),
            hooks=(rec,),
        )
        rec.watch_evaluation()
        try:
            trainer.run()
        except* _Done:
            pass
        assert threading.current_thread() is threading.main_thread()
        serial = report(args, rec, trainer, source, load0)
        if not Config.load(profile="cpu", overrides=args.set).collection.overlap:
            print(f"\ndemo_grpo_step_s: {serial:.2f}")
            return
        steps = overlapped_steps(args, policy_dir, Path(tmp))
        overlapped = sum(steps) / len(steps)
        print(
            f"\nthe profile's step, each update beside the next step's collection (collection.overlap): "
            f"{' '.join(f'{x:.2f}' for x in steps)} s; mean {overlapped:.2f} s against {serial:.2f} s with the "
            f"phases one after another (the table above); load average {os.getloadavg()[0]:.1f} at the end"
        )
        print(f"demo_grpo_step_s: {overlapped:.2f}")


if __name__ == "__main__":
    main()
