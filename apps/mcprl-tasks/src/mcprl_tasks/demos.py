"""Demonstrations for the warm start: the ideal tool-call script of a task, and an imperfect teacher.

A demonstration is a list of chat messages in the model-facing format of ``docs/INTERFACES.md``: assistant
turns holding one ``<tool_call>{"name": ..., "arguments": ...}</tool_call>`` each, ``tool`` messages holding
exactly the text the bundled servers return (computed in-process with the servers' own code), and a final
``<answer>...</answer>`` turn. :func:`imperfect_teacher` corrupts the script the way a weak agent would
(guessing a price instead of looking it up, making a needless call, answering wrongly) so that warm-starting
on it leaves room for RL; :func:`demo_succeeds` scores a script with the task's checker semantics.
"""

from __future__ import annotations

import functools
import json
import math
import random
import re
from typing import Any

from mcprl_servers.calculator import calculate_text
from mcprl_servers.finance import FinanceData
from mcprl_servers.fixture import load_fixture
from mcprl_servers.results import to_json
from mcprl_tasks.errors import TasksError

__all__ = ["Message", "demo_succeeds", "ideal_demo", "imperfect_teacher", "tool_call_text"]

Message = dict[str, str]
_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?(?:e[+-]?\d+)?")


@functools.cache
def _finance() -> FinanceData:
    return FinanceData(load_fixture())


def tool_call_text(name: str, arguments: dict[str, Any]) -> str:
    """An assistant turn making one tool call (Hermes/Qwen style)."""
    return (
        "<tool_call>"
        + json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)
        + "</tool_call>"
    )


def _run(name: str, arguments: dict[str, Any]) -> str:
    """What the bundled server returns for a successful call (same code paths as the MCP tools)."""
    match name:
        case "get_quote":
            return to_json(_finance().quote(arguments["symbol"]))
        case "search_symbols":
            return to_json(_finance().search(arguments["query"]))
        case "get_profile":
            return to_json(_finance().profile(arguments["symbol"]))
        case "calculate":
            return calculate_text(arguments["expression"])
        case "post_message":
            return to_json({"ok": True, "channel": arguments["channel"].strip().lstrip("#").lower()})
        case _:
            raise TasksError(f"demonstrations do not cover tool {name!r}")


class _Script:
    def __init__(self, task: dict[str, Any]) -> None:
        self.messages: list[Message] = []
        if task.get("system"):
            self.messages.append({"role": "system", "content": task["system"]})
        self.messages.append({"role": "user", "content": task["prompt"]})

    def call(self, name: str, arguments: dict[str, Any]) -> str:
        self.messages.append({"role": "assistant", "content": tool_call_text(name, arguments)})
        result = _run(name, arguments)
        self.messages.append({"role": "tool", "content": result})
        return result

    def answer(self, text: str) -> list[Message]:
        self.messages.append({"role": "assistant", "content": f"<answer>{text}</answer>"})
        return self.messages


class _Plan:
    """Hooks through which the imperfect teacher corrupts an otherwise ideal script."""

    def price(self, script: _Script, symbol: str) -> str:
        return json.dumps(json.loads(script.call("get_quote", {"symbol": symbol}))["price"])

    def extra(self, script: _Script, symbol: str) -> None:
        return None

    def final(self, value: str, mistakes: list[str]) -> str:
        return value


def _play(task: dict[str, Any], plan: _Plan) -> list[Message]:
    meta = task["metadata"]
    family, params = meta["family"], meta.get("params", {})
    symbols: list[str] = params.get("symbols", [])
    s = _Script(task)
    match family:
        case "quote":
            price = plan.price(s, symbols[0])
            plan.extra(s, symbols[0])
            return s.answer(plan.final(calculate_text(price), [_scaled(price, 10)]))
        case "quote_mul":
            k = params["k"]
            price = plan.price(s, symbols[0])
            plan.extra(s, symbols[0])
            value = s.call("calculate", {"expression": f"{k} * {price}"})
            return s.answer(plan.final(value, [calculate_text(price), calculate_text(f"{k + 1} * {price}")]))
        case "quote_ratio":
            a, b = plan.price(s, symbols[0]), plan.price(s, symbols[1])
            plan.extra(s, symbols[1])
            value = s.call("calculate", {"expression": f"{a} / {b}"})
            return s.answer(plan.final(value, [calculate_text(f"{b} / {a}"), calculate_text(f"{a} - {b}")]))
        case "post_quote":
            price = plan.final(calculate_text(plan.price(s, symbols[0])), [])
            plan.extra(s, symbols[0])
            s.call("post_message", {"channel": params["channel"], "text": f"{symbols[0]}: {price}"})
            return s.answer(price)
        case "report_ratio":
            a, b = plan.price(s, symbols[0]), plan.price(s, symbols[1])
            plan.extra(s, symbols[0])
            value = plan.final(s.call("calculate", {"expression": f"round({a} / {b}, 2)"}), [])
            s.call(
                "post_message", {"channel": params["channel"], "text": f"{symbols[0]}/{symbols[1]} = {value}"}
            )
            return s.answer(value)
        case "quote_by_name":
            found = json.loads(s.call("search_symbols", {"query": params["query"]}))["results"]
            symbol = found[0]["symbol"] if found else symbols[0]
            price = plan.price(s, symbol)
            return s.answer(plan.final(calculate_text(price), []))
        case _:
            raise TasksError(f"no demonstration for family {family!r}")


def _scaled(text: str, percent: int) -> str:
    return calculate_text(f"round({text} * {100 + percent} / 100, 2)")


def ideal_demo(task: dict[str, Any]) -> list[Message]:
    """The shortest correct tool-call script for ``task``.

    Args:
        task: A task produced by :mod:`mcprl_tasks` (its ``metadata.params`` drive the script).

    Returns:
        Chat messages: the user prompt (after the system prompt, if any), then alternating assistant
        tool calls and tool results, then the final ``<answer>`` turn.

    Raises:
        TasksError: The task's family has no demonstration.
    """
    return _play(task, _Plan())


class _Imperfect(_Plan):
    def __init__(self, rng: random.Random, p_skip: float, p_extra: float, p_wrong: float) -> None:
        self.rng, self.p_skip, self.p_extra, self.p_wrong = rng, p_skip, p_extra, p_wrong

    def price(self, script: _Script, symbol: str) -> str:
        if self.rng.random() < self.p_skip:
            true = _finance().quote(symbol)["price"]
            return json.dumps(round(true * self.rng.uniform(0.5, 1.5), 2))
        return super().price(script, symbol)

    def extra(self, script: _Script, symbol: str) -> None:
        if self.rng.random() < self.p_extra:
            if self.rng.random() < 0.5:
                script.call("get_quote", {"symbol": symbol})
            else:
                script.call("search_symbols", {"query": symbol})

    def final(self, value: str, mistakes: list[str]) -> str:
        if self.rng.random() >= self.p_wrong:
            return value
        options = [m for m in mistakes if m != value] or [_scaled(value, self.rng.choice((-15, -5, 5, 15)))]
        return self.rng.choice(options)


def imperfect_teacher(
    task: dict[str, Any],
    rng: random.Random,
    *,
    p_skip_lookup: float = 0.25,
    p_extra_call: float = 0.2,
    p_wrong_answer: float = 0.2,
) -> list[Message]:
    """A demonstration with a weak agent's mistakes.

    Args:
        task: The task.
        rng: Source of the mistakes (seed it for reproducible demonstrations).
        p_skip_lookup: Per price lookup: guess the price (±50 %) instead of calling ``get_quote``.
        p_extra_call: Per task: add an unnecessary call (a repeated quote or a symbol search).
        p_wrong_answer: Per task: give (or post) a plausible wrong value instead of the computed one.

    Returns:
        Chat messages as in :func:`ideal_demo`. With the defaults about 55 % of demo-preset scripts
        succeed (see the package README for the measured rate).
    """
    for p in (p_skip_lookup, p_extra_call, p_wrong_answer):
        if not 0.0 <= p <= 1.0:
            raise ValueError("probabilities must be in [0, 1]")
    return _play(task, _Imperfect(rng, p_skip_lookup, p_extra_call, p_wrong_answer))


def _numbers(text: str) -> list[float]:
    return [float(m) for m in _NUMBER.findall(text)]


def demo_succeeds(task: dict[str, Any], messages: list[Message]) -> bool:
    """Whether a script satisfies the task's checker (numeric, exact, contains or message_posted)."""
    checker = task["checker"]
    final = messages[-1]["content"] if messages and messages[-1]["role"] == "assistant" else ""
    match = _ANSWER.search(final)
    answer = (match.group(1) if match else final).strip()
    match checker["type"]:
        case "numeric":
            want = float(task["answer"])
            got = _numbers(answer)
            return bool(got) and math.isclose(
                got[0], want, rel_tol=checker["rel_tol"], abs_tol=checker["abs_tol"]
            )
        case "exact":
            return " ".join(answer.lower().split()) == " ".join(str(task["answer"]).lower().split())
        case "contains":
            return str(task["answer"]).lower() in answer.lower()
        case "message_posted":
            return _posted(messages, checker["channel"], checker["contains"])
        case other:
            raise TasksError(f"unknown checker type {other!r}")


def _posted(messages: list[Message], channel: str, needle: str) -> bool:
    for message in messages:
        if message["role"] != "assistant" or "<tool_call>" not in message["content"]:
            continue
        body = message["content"].split("<tool_call>", 1)[1].rsplit("</tool_call>", 1)[0]
        call = json.loads(body)
        args = call["arguments"]
        if (
            call["name"] == "post_message"
            and args["channel"].lstrip("#").lower() == channel
            and needle.lower() in args["text"].lower()
        ):
            return True
    return False
