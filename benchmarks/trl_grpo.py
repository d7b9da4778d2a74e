"""TRL's side of ``bench_vs_trl.py``: the demo trained by TRL's ``GRPOTrainer`` and its own tool-calling loop.

Runs in TRL's interpreter (``TRL_PYTHON``), never in the workspace: TRL is not a dependency of mcprl. That
environment needs ``trl``, ``mcp`` and the workspace's pure-python packages installed without dependencies
(``pip install --no-deps -e packages/mcprl-env -e packages/mcprl-tools -e apps/mcprl-servers -e
apps/mcprl-tasks``, plus ``structlog tenacity bm25s attrs``) for the same servers, checker and reward.

What is TRL's and what is the bench's:

- **Loop**: TRL's (``GRPOTrainer._tool_call_loop``): generate with ``model.generate`` for the whole batch, parse
  tool calls with ``tokenizer.parse_response``, run each rollout's calls, append the tool turn's tokens and
  generate again for the rollouts that called a tool, up to ``max_tool_calling_iterations``.
- **Tools**: ``environment_factory`` with one environment class per server set of the demo tasks (the tools
  a task may use, as on mcprl's side); each method calls the real bundled MCP server (``python -m
  mcprl_servers.<name>``, one stdio process per server, shared by all rollouts) with the ``mcp`` SDK and
  returns the result's text, the text mcprl shows the model. Each rollout sends its own episode id in the
  request ``_meta`` so the messaging server keeps its posts apart, as mcprl does.
- **Template**: the tiny model's compact Qwen3-style template is not one TRL recognises (``add_response_schema``
  raises on it), so the tokenizer gets TRL's own Qwen3 ``response_template``: the tool-call markup is the same
  (``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``). ``main`` checks that it parses the template's
  own rendering of a call before training.
- **Reward**: mcprl's (``mcprl_env.rewards.combine_rewards`` with the default weights) on a ``RewardContext``
  read from TRL's completion messages; success is ``mcprl_tasks.demo_succeeds`` (the demo checker).

Per optimizer step it appends ``{"step", "wall_s", "cpu_s"}`` to ``<out>/steps.jsonl`` and every
``--save-every`` steps writes the weights to ``<out>/step-N/`` (with the warm model's tokenizer files) for
the bench to evaluate with mcprl's evaluator.
"""

# TRL and datasets live in TRL_PYTHON, not in the workspace that pyright reads.
# pyright: reportMissingImports=false

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import shutil
import sys
import time
import uuid
from pathlib import Path
from typing import Any

_SERVERS = ("finance", "calculator", "messaging")
_EPISODE_META_KEY = "mcprl/episode_id"


class ServerPool:
    """One stdio connection per bundled server, opened on first use inside TRL's tool event loop.

    The connections are owned by one task of that loop (``_hold``), so every ``async with`` is entered and
    left by the same task, as anyio requires; tool coroutines only send requests over them.
    """

    def __init__(self) -> None:
        self._clients: dict[str, Any] = {}
        self._ready: asyncio.Event | None = None
        self._stop: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self._error: BaseException | None = None

    async def call(
        self, server: str, tool: str, arguments: dict[str, Any], episode_id: str
    ) -> tuple[str, bool]:
        """The tool's result text and whether the server flagged it as an error."""
        if self._ready is None:
            self._ready, self._stop = asyncio.Event(), asyncio.Event()
            self._task = asyncio.get_running_loop().create_task(self._hold())
        await self._ready.wait()
        if self._error is not None:
            raise RuntimeError(f"the MCP servers did not start: {self._error!r}")
        session = self._clients[server].session
        result = await session.call_tool(tool, arguments, meta={_EPISODE_META_KEY: episode_id})
        text = "\n".join(getattr(block, "text", "") for block in result.content)
        return text, bool(result.is_error)

    async def _hold(self) -> None:
        from mcp import Client
        from mcp.client.stdio import StdioServerParameters

        assert self._ready is not None
        assert self._stop is not None
        try:
            async with contextlib.AsyncExitStack() as stack:
                for name in _SERVERS:
                    params = StdioServerParameters(
                        command=sys.executable, args=["-m", f"mcprl_servers.{name}"]
                    )
                    self._clients[name] = await stack.enter_async_context(Client(params))
                self._ready.set()
                await self._stop.wait()
        except BaseException as exc:  # the waiting tool calls report it; nothing else can
            self._error = exc
            self._ready.set()
            raise

    async def close(self) -> None:
        if self._stop is not None and self._task is not None:
            self._stop.set()
            with contextlib.suppress(Exception):
                await self._task


POOL = ServerPool()


class _Episode:
    """State TRL keeps per rollout: the episode id sent to the servers and the tool results' outcomes."""

    def __init__(self) -> None:
        self.episode_id = ""
        self.calls_ok = 0
        self.calls_failed = 0

    def reset(self, **_: Any) -> None:
        self.episode_id = uuid.uuid4().hex
        self.calls_ok = 0
        self.calls_failed = 0

    async def _call(self, server: str, tool: str, **arguments: Any) -> str:
        text, is_error = await POOL.call(server, tool, arguments, self.episode_id)
        if is_error:
            self.calls_failed += 1
        else:
            self.calls_ok += 1
        return text


class _Finance(_Episode):
    async def get_quote(self, symbol: str) -> str:
        """Latest price of a stock, e.g. symbol 'HLDR'.

        Args:
            symbol: The ticker.
        """
        return await self._call("finance", "get_quote", symbol=symbol)

    async def search_symbols(self, query: str) -> str:
        """Find stock symbols by company name or symbol prefix.

        Args:
            query: A company name or symbol prefix.
        """
        return await self._call("finance", "search_symbols", query=query)


class FinanceEnv(_Finance):
    """Tasks that use the finance server alone."""


class FinanceCalculatorEnv(_Finance):
    """Tasks that use finance and the calculator."""

    async def calculate(self, expression: str) -> str:
        """Evaluate an arithmetic expression exactly, e.g. '3 * 42.17'.

        Args:
            expression: The expression.
        """
        return await self._call("calculator", "calculate", expression=expression)


class FinanceMessagingEnv(_Finance):
    """Tasks that use finance and messaging."""

    async def post_message(self, channel: str, text: str) -> str:
        """Post a message to a channel, e.g. channel 'markets'.

        Args:
            channel: The channel.
            text: The message.
        """
        return await self._call("messaging", "post_message", channel=channel, text=text)

    async def read_messages(self, channel: str, limit: int = 20) -> str:
        """Read the most recent messages of a channel (oldest first), at most `limit` (1-100).

        Args:
            channel: The channel.
            limit: How many messages.
        """
        return await self._call("messaging", "read_messages", channel=channel, limit=limit)


ENVIRONMENTS: dict[tuple[str, ...], type[_Episode]] = {
    ("finance",): FinanceEnv,
    ("finance", "calculator"): FinanceCalculatorEnv,
    ("finance", "messaging"): FinanceMessagingEnv,
}
# mcprl renders a task's tools in the servers' own order; TRL lists an environment's methods by name.
TOOL_ORDER = ("get_quote", "search_symbols", "calculate", "post_message", "read_messages")


def env_name(servers: list[str]) -> str:
    return "+".join(servers)


def load_rows(path: Path, max_turns: dict[str, int]) -> list[dict[str, Any]]:
    from mcprl_tasks import read_tasks

    rows = []
    for task in read_tasks(path):
        key = tuple(task["servers"])
        if key not in ENVIRONMENTS:
            raise SystemExit(
                f"task {task['id']}: no TRL environment for servers {key}; known: {list(ENVIRONMENTS)}"
            )
        rows.append(
            {
                "prompt": [{"role": "user", "content": task["prompt"]}],
                "environment": env_name(task["servers"]),
                "task": json.dumps(task),
                "max_turns": max_turns[task["difficulty"]],
            }
        )
    return rows


_REQUIRED = {
    "get_quote": ("symbol",),
    "search_symbols": ("query",),
    "calculate": ("expression",),
    "post_message": ("channel", "text"),
    "read_messages": ("channel",),
}


def well_formed(call: dict[str, Any]) -> bool:
    """A call mcprl would run: a known tool with its required string arguments (else a schema-invalid call)."""
    function = call.get("function") or {}
    arguments = function.get("arguments")
    required = _REQUIRED.get(function.get("name", ""))
    if required is None or not isinstance(arguments, dict):
        return False
    return all(isinstance(arguments.get(key), str) for key in required)


def episode_reward(
    task: dict[str, Any], messages: list[dict[str, Any]], env: _Episode, max_turns: int
) -> float:
    """mcprl's shaped reward (default `RewardConfig` weights) of one TRL completion."""
    from mcprl_env.config import RewardConfig
    from mcprl_env.rewards import RewardContext, combine_rewards
    from mcprl_tasks import demo_succeeds
    from mcprl_tasks.scoring import final_answer

    malformed = sum(not well_formed(c) for m in messages for c in m.get("tool_calls") or [])
    messages = [
        {**m, "tool_calls": [c for c in m["tool_calls"] if well_formed(c)]} if m.get("tool_calls") else m
        for m in messages
    ]
    assistant = [m for m in messages if m["role"] == "assistant"]
    calls = sum(len(m.get("tool_calls") or []) for m in assistant) + malformed
    # A call TRL could not parse stays as text in the assistant's content.
    parse_errors = sum(
        1 for m in assistant if not m.get("tool_calls") and "<tool_call>" in str(m.get("content") or "")
    )
    unknown = sum(
        1 for m in messages if m["role"] == "tool" and str(m.get("content", "")).startswith("{'error'")
    )
    answer = final_answer(messages)
    answered = answer is not None and parse_errors == 0
    ctx = RewardContext(
        success=demo_succeeds(task, messages),
        answered=answered,
        stop_reason="answer" if answered else "max_turns",
        turns=len(assistant),
        max_turns=max_turns,
        tool_calls=calls,
        tool_calls_ok=env.calls_ok,
        # A malformed call also fails in TRL's loop ({'error': ...}): the two counts overlap.
        invalid_calls=parse_errors + max(unknown, malformed),
        parse_errors=parse_errors,
        answer_given=bool(answer),
    )
    reward, _ = combine_rewards(ctx, RewardConfig())
    return reward


def mcprl_reward(
    completions: list[list[dict[str, Any]]], environments: list[_Episode], **columns: Any
) -> list[float]:
    tasks = [json.loads(t) for t in columns["task"]]
    return [
        episode_reward(task, messages, env, turns)
        for task, messages, env, turns in zip(
            tasks, completions, environments, columns["max_turns"], strict=True
        )
    ]


def check_parser(tokenizer: Any) -> None:
    """The response template must read back a call the chat template renders (else TRL sees no tool calls)."""
    call = {"type": "function", "function": {"name": "get_quote", "arguments": {"symbol": "ABCD"}}}
    messages = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "", "tool_calls": [call]}]
    prefix = tokenizer.apply_chat_template(
        messages[:1], add_generation_prompt=True, tokenize=True, return_dict=False
    )
    full = tokenizer.apply_chat_template(messages, tokenize=True, return_dict=False)
    parsed = tokenizer.parse_response(full[len(prefix) :], prefix=prefix)
    got = [c["function"] for c in parsed.get("tool_calls") or []]
    if got != [call["function"]]:
        raise SystemExit(f"TRL's Qwen3 response template does not parse the model's tool call: {parsed!r}")


class StepClock:
    """Wall-clock and process CPU time of each optimizer step (generation, tools, rewards, update)."""

    def __init__(self, out: Path) -> None:
        self.path = out / "steps.jsonl"
        self.wall = self.cpu = 0.0

    def callback(self) -> Any:
        from transformers import TrainerCallback

        clock = self

        class _Clock(TrainerCallback):
            def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
                clock.wall, clock.cpu = time.perf_counter(), time.process_time()

            def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
                row = {
                    "step": state.global_step,
                    "wall_s": time.perf_counter() - clock.wall,
                    "cpu_s": time.process_time() - clock.cpu,
                }
                with clock.path.open("a") as f:
                    f.write(json.dumps(row) + "\n")

        return _Clock()


def saver(warm: Path, out: Path, every: int) -> Any:
    from transformers import TrainerCallback

    class _Save(TrainerCallback):
        def on_step_end(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
            if state.global_step % every == 0 or state.global_step == state.max_steps:
                target = out / f"step-{state.global_step}"
                model.save_pretrained(target, safe_serialization=True)
                for item in warm.iterdir():
                    if item.name not in ("model.safetensors", "config.json", "generation_config.json"):
                        shutil.copy(item, target / item.name)

    return _Save()


def grpo_config(args: argparse.Namespace) -> Any:
    """TRL's configuration, matched to the mcprl side field by field (the comments say what differs)."""
    from trl import GRPOConfig

    return GRPOConfig(
        output_dir=str(args.out / "trainer"),
        use_cpu=True,
        seed=args.seed,
        num_generations=args.group_size,  # G
        per_device_train_batch_size=args.group_size,  # one group per micro-batch ...
        gradient_accumulation_steps=args.tasks_per_step,  # ... and one optimizer step per generation batch
        num_iterations=1,  # grpo.ppo_epochs=1, minibatches=1
        max_steps=args.steps,
        learning_rate=args.lr,
        lr_scheduler_type="constant",
        warmup_steps=0,
        weight_decay=0.0,
        adam_beta1=0.9,
        adam_beta2=0.999,
        adam_epsilon=1e-8,
        max_grad_norm=1.0,
        beta=0.0,  # grpo.kl_coef=0: no reference model
        epsilon=0.2,  # clip_eps_low = clip_eps_high = 0.2
        loss_type="dapo",  # token-mean over the batch (mcprl grpo.aggregation=token-mean)
        scale_rewards="none",  # Dr. GRPO advantages r - mean(group) (mcprl grpo.estimator=dr_grpo)
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        # TRL caps a rollout's completion (all turns and tool results together) and each turn's generation with
        # this one number; mcprl caps each turn (64) and the whole episode (1024, prompt included).
        max_completion_length=args.max_completion_length,
        # TRL has one limit for every task; mcprl's turn limit is by difficulty (easy 4, medium 5 turns).
        max_tool_calling_iterations=args.max_tool_iterations,
        logging_steps=1,
        report_to="none",
        save_strategy="no",
        bf16=False,
        dataloader_num_workers=0,
        disable_tqdm=True,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--model", type=Path, required=True, help="the warm-started model directory")
    parser.add_argument("--tasks", type=Path, required=True, help="the training task file (demo preset)")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--tasks-per-step", type=int, required=True)
    parser.add_argument("--group-size", type=int, required=True)
    parser.add_argument("--lr", type=float, required=True)
    parser.add_argument("--save-every", type=int, required=True)
    parser.add_argument("--max-completion-length", type=int, default=512)
    parser.add_argument("--max-tool-iterations", type=int, default=4)
    parser.add_argument("--max-turns", type=str, default='{"easy": 4, "medium": 5, "hard": 6}')
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    args = parser.parse_args(argv)

    import torch
    import trl
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOTrainer
    from trl.chat_template_utils import qwen3_template

    if args.threads:
        torch.set_num_threads(args.threads)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "steps.jsonl").unlink(missing_ok=True)
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    tokenizer.response_template = qwen3_template
    check_parser(tokenizer)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    rows = load_rows(args.tasks, json.loads(args.max_turns))
    factories = {env_name(list(k)): cls for k, cls in ENVIRONMENTS.items()}
    config = grpo_config(args)
    clock = StepClock(args.out)
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=mcprl_reward,
        args=config,
        train_dataset=Dataset.from_list(rows),
        processing_class=tokenizer,
        environment_factory=factories,
        callbacks=[clock.callback(), saver(args.model, args.out, args.save_every)],
    )
    for name, tools in trainer._env_tools.items():
        tools.sort(key=lambda tool: TOOL_ORDER.index(tool.__name__))
        assert tools, name
    if trainer.chat_template is not None:
        raise SystemExit("TRL replaced the chat template (not prefix-preserving): the two sides would differ")
    (args.out / "config.json").write_text(
        json.dumps({"trl": trl.__version__, "torch": torch.__version__, **config.to_dict()}, default=str)
    )
    try:
        trainer.train()
    finally:
        asyncio.run_coroutine_threadsafe(POOL.close(), trainer.async_loop).result(timeout=30)
    (args.out / "log_history.json").write_text(json.dumps(trainer.state.log_history))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
