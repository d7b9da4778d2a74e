"""`mcprl-train collect-demos`: warm-start demonstrations by rejection sampling from a stronger model.

A model behind an OpenAI-compatible chat-completions endpoint (a vLLM server, a local model, a hosted API)
runs each training task with the run's tool servers (`mcprl_tools.ToolManager`), the tools the environment
gives the task (`mcprl_env.ToolAccess`) and its turn limit; the task's own checker (`mcprl_env.check_outcome`,
a user's Python checker included) scores the outcome, and only the successful episodes are written, one line
each, in the format `sft.demos_path` reads (`mcprl_train.loop.demo_file`). A call the endpoint writes to a
tool the task does not offer, or with arguments that are not a JSON object, fails the episode (the stronger
model's mistake, not a demonstration). Tool results are kept whole: the warm start renders them as given.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, cast

import anyio
import attrs
import httpx

from mcprl_env import (
    FinishedEpisode,
    HermesToolCallParser,
    Task,
    ToolAccess,
    ToolCaller,
    ToolCallRecord,
    check_outcome,
)
from mcprl_train import build
from mcprl_train.config import Config
from mcprl_train.errors import TrainError

__all__ = ["CollectError", "Endpoint", "collect_demos"]


class CollectError(TrainError, RuntimeError):
    """The endpoint or a tool server failed (not the stronger model's mistake)."""


@attrs.frozen(kw_only=True)
class Endpoint:
    """An OpenAI-compatible chat-completions endpoint.

    Attributes:
        base_url: The API root (``http://localhost:8000/v1``); ``/chat/completions`` is appended.
        model: The model name sent with each request.
        api_key: Sent as a bearer token when given.
        temperature: Sampling temperature (attempts after the first need > 0 to differ).
        timeout_s: Per-request timeout.
    """

    base_url: str
    model: str
    api_key: str | None = None
    temperature: float = 1.0
    timeout_s: float = 120.0

    @classmethod
    def from_env(cls, base_url: str, model: str, *, api_key_env: str | None, **kwargs: Any) -> Endpoint:
        """The endpoint, with its key read from the environment variable ``api_key_env`` (when given)."""
        key = None
        if api_key_env is not None:
            key = os.environ.get(api_key_env)
            if not key:
                raise CollectError(f"--api-key-env {api_key_env}: the environment variable is not set")
        return cls(base_url=base_url, model=model, api_key=key, **kwargs)


async def collect_demos(
    config: Config, endpoint: Endpoint, out: Path, *, attempts: int = 1, max_tasks: int | None = None
) -> dict[str, float]:
    """Run the endpoint's model on the training tasks and write its successful episodes to ``out`` (JSONL).

    Each task gets up to ``attempts`` episodes; the first success is kept. Returns ``collect/*`` counts.

    Raises:
        CollectError: the endpoint answered with an HTTP error or no message, or a tool server failed.
    """
    tasks, _ = build.load_tasks(config)
    n = len(tasks) if max_tasks is None else min(max_tasks, len(tasks))
    headers = {"Authorization": f"Bearer {endpoint.api_key}"} if endpoint.api_key else {}
    from mcprl_tools import ToolManager

    kept = episodes = 0
    out.parent.mkdir(parents=True, exist_ok=True)
    async with (
        ToolManager(build.servers_config(config)) as manager,
        httpx.AsyncClient(base_url=endpoint.base_url, headers=headers, timeout=endpoint.timeout_s) as client,
    ):
        with out.open("w", encoding="utf-8") as f:
            for i in range(n):
                task = tasks.task_at(i)
                access = ToolAccess.for_task(manager, task)
                max_turns = config.env.max_turns_for(task.difficulty, task.max_turns)
                for attempt in range(attempts):
                    episodes += 1
                    episode_id = f"collect:{task.id}:{attempt}"
                    messages = await _episode(task, access, manager, client, endpoint, max_turns, episode_id)
                    if messages is not None:
                        line = {"task_id": task.id, "messages": messages, "tools": list(access.schemas)}
                        f.write(json.dumps(line, ensure_ascii=False) + "\n")
                        kept += 1
                        break
    return {
        "collect/tasks": float(n),
        "collect/episodes": float(episodes),
        "collect/kept": float(kept),
        "collect/task_success": kept / n if n else 0.0,
    }


async def _episode(
    task: Task,
    access: ToolAccess,
    manager: ToolCaller,
    client: httpx.AsyncClient,
    endpoint: Endpoint,
    max_turns: int,
    episode_id: str,
) -> list[dict[str, Any]] | None:
    """One episode's messages when the task's checker accepts it, else None."""
    messages = task.initial_messages()
    records: list[ToolCallRecord] = []
    for turn in range(max_turns):
        reply = await _complete(client, endpoint, messages, list(access.schemas))
        content = reply.get("content") or ""
        raw_calls = cast("list[dict[str, Any]]", reply.get("tool_calls") or [])
        if not raw_calls:
            messages.append({"role": "assistant", "content": content})
            answer = HermesToolCallParser().parse(content).answer
            finished = FinishedEpisode(
                task=task,
                episode_id=episode_id,
                messages=tuple(messages),
                answer=answer,
                tool_calls=tuple(records),
                stop_reason="answer",
                manager=manager,
            )
            result = await check_outcome(
                task, answer, manager=manager, episode_id=episode_id, episode=finished
            )
            if result.infra_error is not None:
                raise CollectError(f"task {task.id!r}: the checker failed: {result.infra_error}")
            return messages if result.correct else None
        calls = [_call(c) for c in raw_calls]
        if any(c is None or c["function"]["name"] not in access.callable_names for c in calls):
            return None
        messages.append({"role": "assistant", "content": content, "tool_calls": calls})
        for call in cast("list[dict[str, Any]]", calls):
            name, arguments = call["function"]["name"], call["function"]["arguments"]
            outcome = await manager.call(name, arguments, episode_id=episode_id)
            if outcome.kind == "infra_error":
                raise CollectError(f"task {task.id!r}: {name}: {outcome.error_type}: {outcome.text}")
            records.append(ToolCallRecord.of(turn, name, arguments, outcome, outcome.text))
            tool: dict[str, Any] = {"role": "tool", "name": name, "content": outcome.text}
            if "id" in call:
                tool["tool_call_id"] = call["id"]
            messages.append(tool)
    return None


def _call(raw: dict[str, Any]) -> dict[str, Any] | None:
    """A structured call with object arguments, or None when the arguments are not a JSON object."""
    function = cast("dict[str, Any]", raw.get("function") or {})
    arguments: object = function.get("arguments") or {}
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            return None
    if not isinstance(arguments, dict) or not isinstance(function.get("name"), str):
        return None
    call: dict[str, Any] = {
        "type": "function",
        "function": {"name": function["name"], "arguments": arguments},
    }
    if isinstance(raw.get("id"), str):
        call["id"] = raw["id"]
    return call


async def _complete(
    client: httpx.AsyncClient, endpoint: Endpoint, messages: list[dict[str, Any]], tools: list[dict[str, Any]]
) -> dict[str, Any]:
    body = {
        "model": endpoint.model,
        "messages": [_wire(m) for m in messages],
        "tools": tools,
        "temperature": endpoint.temperature,
    }
    try:
        response = await client.post("/chat/completions", json=body)
        response.raise_for_status()
        message = response.json()["choices"][0]["message"]
    except (httpx.HTTPError, KeyError, IndexError, ValueError) as e:
        raise CollectError(f"{endpoint.base_url}/chat/completions: {type(e).__name__}: {e}") from e
    if not isinstance(message, dict):
        raise CollectError(f"{endpoint.base_url}/chat/completions: the reply has no message")
    return cast("dict[str, Any]", message)


def _wire(message: dict[str, Any]) -> dict[str, Any]:
    """A message as the chat-completions API takes it (call arguments as JSON strings)."""
    if not message.get("tool_calls"):
        return message
    calls = [
        {**c, "function": {**c["function"], "arguments": json.dumps(c["function"]["arguments"])}}
        for c in message["tool_calls"]
    ]
    return {**message, "tool_calls": calls}


def run_collect(
    config: Config, endpoint: Endpoint, out: Path, *, attempts: int, max_tasks: int | None
) -> dict[str, float]:
    """`collect_demos` from synchronous code (the CLI)."""
    return anyio.run(lambda: collect_demos(config, endpoint, out, attempts=attempts, max_tasks=max_tasks))
