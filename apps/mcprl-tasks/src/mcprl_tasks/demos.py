"""Demonstrations for the warm start: the ideal tool-call script of a task, and an imperfect teacher.

A demonstration is a list of chat messages in the OpenAI format: assistant turns holding one structured call
each (``tool_calls: [{"type": "function", "function": {"name": ..., "arguments": {...}}}]``, empty content),
``tool`` messages naming the tool and holding exactly the text the bundled servers return (see
:mod:`mcprl_tasks.toolsim`), and a final ``<answer>...</answer>`` turn. The model's own chat template renders
the calls in its own format (Hermes/Qwen ``<tool_call>`` JSON, Qwen3.5 XML, Llama 3 JSON). :func:`imperfect_teacher` corrupts the script the way a weak agent would
(guessing instead of looking up, making a needless call, answering wrongly, mistyping a ticker and retrying
after the server's error) so that warm-starting on it leaves room for RL; :func:`demo_succeeds` scores a script with the task's checker semantics.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from typing import Any

from mcprl_servers.calculator import calculate_text
from mcprl_servers.corpus import load_corpus
from mcprl_servers.workspace_seed import SEED_CHANNELS, SEED_USERS
from mcprl_tasks.errors import TasksError
from mcprl_tasks.messaging_families import latest_message
from mcprl_tasks.scoring import Message, demo_succeeds
from mcprl_tasks.toolsim import known_symbol, simulate_tool, simulate_tool_error, tool_call, tool_call_text

__all__ = [
    "Message",
    "demo_succeeds",
    "ideal_demo",
    "imperfect_teacher",
    "python_ratio_output",
    "tool_call",
    "tool_call_text",
    "with_reasoning",
]

Call = tuple[str, dict[str, Any]]


def python_ratio_output(a: str, b: str) -> str:
    """What ``run_python`` prints for ``print(round(a / b, 2))`` (Python floats, round-half-even)."""
    return f"{round(float(a) / float(b), 2)!r}\n"


class _Script:
    def __init__(self, task: dict[str, Any]) -> None:
        self.task = task
        self.params: dict[str, Any] = task["metadata"].get("params", {})
        self.messages: list[Message] = []
        if task.get("system"):
            self.messages.append({"role": "system", "content": task["system"]})
        self.messages.append({"role": "user", "content": task["prompt"]})

    def call(
        self, name: str, arguments: dict[str, Any], result: str | None = None, *, target: bool = True
    ) -> str:
        message: Message = {"role": "assistant", "content": "", "tool_calls": [tool_call(name, arguments)]}
        if not target:
            message["weight"] = 0  # context only: the warm start does not imitate it
        self.messages.append(message)
        text = simulate_tool(name, arguments) if result is None else result
        self.messages.append({"role": "tool", "name": name, "content": text})
        return text

    def answer(self, text: str) -> list[Message]:
        self.messages.append({"role": "assistant", "content": f"<answer>{text}</answer>"})
        return self.messages


class _Plan:
    """Decisions of an ideal agent; the imperfect teacher overrides them."""

    def skips(self) -> bool:
        return False

    def price(self, script: _Script, symbol: str) -> str:
        return json.dumps(json.loads(script.call("get_quote", {"symbol": symbol}))["price"])

    def extra(self, script: _Script, options: list[Call]) -> None:
        return None

    def final(self, value: str, mistakes: list[str]) -> str:
        return value


def _scaled(text: str, percent: int) -> str:
    return calculate_text(f"round({text} * {100 + percent} / 100, 2)")


def _quote_extras(symbol: str) -> list[Call]:
    return [("get_quote", {"symbol": symbol}), ("search_symbols", {"query": symbol})]


def _quote(s: _Script, p: _Plan) -> list[Message]:
    (symbol,) = s.params["symbols"]
    price = p.price(s, symbol)
    p.extra(s, _quote_extras(symbol))
    return s.answer(p.final(calculate_text(price), [_scaled(price, 10)]))


def _quote_mul(s: _Script, p: _Plan) -> list[Message]:
    (symbol,), k = s.params["symbols"], s.params["k"]
    price = p.price(s, symbol)
    p.extra(s, _quote_extras(symbol))
    value = s.call("calculate", {"expression": f"{k} * {price}"})
    return s.answer(p.final(value, [calculate_text(price), calculate_text(f"{k + 1} * {price}")]))


def _quote_ratio(s: _Script, p: _Plan) -> list[Message]:
    first, second = s.params["symbols"]
    a, b = p.price(s, first), p.price(s, second)
    p.extra(s, _quote_extras(second))
    value = s.call("calculate", {"expression": f"{a} / {b}"})
    return s.answer(p.final(value, [calculate_text(f"{b} / {a}"), calculate_text(f"{a} - {b}")]))


def _post_quote(s: _Script, p: _Plan) -> list[Message]:
    (symbol,) = s.params["symbols"]
    price = p.final(calculate_text(p.price(s, symbol)), [])
    p.extra(s, _quote_extras(symbol))
    s.call("post_message", {"channel": s.params["channel"], "text": f"{symbol}: {price}"})
    return s.answer(price)


def _report_ratio(s: _Script, p: _Plan) -> list[Message]:
    first, second = s.params["symbols"]
    a, b = p.price(s, first), p.price(s, second)
    p.extra(s, _quote_extras(first))
    if s.params.get("compute") == "python":
        output = python_ratio_output(a, b)
        value = s.call("run_python", {"code": f"print(round({a} / {b}, 2))"}, result=output).strip()
    else:
        value = s.call("calculate", {"expression": f"round({a} / {b}, 2)"})
    value = p.final(value, [])
    s.call("post_message", {"channel": s.params["channel"], "text": f"{first}/{second} = {value}"})
    return s.answer(value)


def _quote_by_name(s: _Script, p: _Plan) -> list[Message]:
    found = json.loads(s.call("search_symbols", {"query": s.params["query"]}))["results"]
    symbol = found[0]["symbol"] if found else s.params["symbols"][0]
    price = p.price(s, symbol)
    return s.answer(p.final(calculate_text(price), [_scaled(price, 10)]))


def _news_fact(s: _Script, p: _Plan) -> list[Message]:
    fact = s.task["answer"]
    kind = next(d["meta"]["kind"] for d in load_corpus() if d["doc_id"] == s.params["doc_id"])
    others = [
        d["meta"]["fact"] for d in load_corpus() if d["meta"]["kind"] == kind and d["meta"]["fact"] != fact
    ]
    if p.skips():
        return s.answer(p.final(others[0], others))
    top = json.loads(s.call("search", {"query": s.params["query"]}))["results"][0]
    p.extra(s, [("search", {"query": s.params["query"]})])
    if s.task["metadata"]["min_tool_calls"] > 1:
        s.call("fetch_document", {"doc_id": top["doc_id"]})
    return s.answer(p.final(fact, others))


def _channel_topic(s: _Script, p: _Plan) -> list[Message]:
    others = [t for name, t, _ in SEED_CHANNELS if name != s.params["channel"]]
    if p.skips():
        return s.answer(others[0])
    s.call("list_channels", {})
    p.extra(s, [("list_channels", {}), ("read_messages", {"channel": s.params["channel"], "limit": 1})])
    return s.answer(p.final(s.task["answer"], others))


def _user_lookup(s: _Script, p: _Plan) -> list[Message]:
    column = 2 if s.params["direction"] == "title" else 1
    others = [u[column] for u in SEED_USERS if u[0] not in (s.params["user"], "agent")]
    if p.skips():
        return s.answer(others[0])
    s.call("list_users", {})
    p.extra(s, [("list_users", {})])
    return s.answer(p.final(s.task["answer"], others))


def _who_posted(s: _Script, p: _Plan) -> list[Message]:
    others = [u[0] for u in SEED_USERS if u[0] not in (s.task["answer"], "agent")]
    if p.skips():
        return s.answer(others[0])
    s.call("search_messages", {"query": s.params["query"]})
    p.extra(s, [("list_users", {})])
    return s.answer(p.final(s.task["answer"], others))


def _relay(s: _Script, p: _Plan) -> list[Message]:
    source, target = s.params["source"], s.params["channel"]
    others = [latest_message(c[0])[1] for c in SEED_CHANNELS if c[0] not in (source, target)]
    if p.skips():
        text = others[0]
    else:
        s.call("read_messages", {"channel": source, "limit": 1})
        p.extra(s, [("read_messages", {"channel": target, "limit": 1})])
        text = p.final(latest_message(source)[1], others)
    s.call("post_message", {"channel": target, "text": text})
    return s.answer(text)


_FAMILIES: dict[str, Callable[[_Script, _Plan], list[Message]]] = {
    "quote": _quote,
    "quote_mul": _quote_mul,
    "quote_ratio": _quote_ratio,
    "post_quote": _post_quote,
    "report_ratio": _report_ratio,
    "quote_by_name": _quote_by_name,
    "news_fact": _news_fact,
    "channel_topic": _channel_topic,
    "user_lookup": _user_lookup,
    "who_posted": _who_posted,
    "relay": _relay,
}


def _play(task: dict[str, Any], plan: _Plan) -> list[Message]:
    family = task["metadata"]["family"]
    script = _FAMILIES.get(family)
    if script is None:
        raise TasksError(f"no demonstration for family {family!r}")
    return script(_Script(task), plan)


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
    def __init__(
        self, rng: random.Random, p_skip: float, p_extra: float, p_wrong: float, p_typo: float
    ) -> None:
        self.rng, self.p_skip, self.p_extra, self.p_wrong = rng, p_skip, p_extra, p_wrong
        self.p_typo, self.retried = p_typo, False

    def skips(self) -> bool:
        return self.rng.random() < self.p_skip

    def price(self, script: _Script, symbol: str) -> str:
        if self.skips():
            true = float(json.loads(simulate_tool("get_quote", {"symbol": symbol}))["price"])
            return json.dumps(round(true * self.rng.uniform(0.5, 1.5), 2))
        # No draw when typos are off, so the other mistakes stay the same for a given seed.
        if self.p_typo > 0 and not self.retried and self.rng.random() < self.p_typo:
            arguments = {"symbol": self._typo(script, symbol)}
            script.call(
                "get_quote", arguments, result=simulate_tool_error("get_quote", arguments), target=False
            )
            self.retried = True
        return super().price(script, symbol)

    def _typo(self, script: _Script, symbol: str) -> str:
        """``symbol`` with one letter replaced (by a letter of the task's other ticker, when it has one,
        as a small model mixes them up) so that it names no listed company."""
        others = "".join(s for s in script.params.get("symbols", []) if s != symbol)
        pool = others or "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
        for _ in range(100):
            i = self.rng.randrange(len(symbol))
            typo = symbol[:i] + self.rng.choice(pool) + symbol[i + 1 :]
            if typo != symbol and not known_symbol(typo):
                return typo
        return symbol + symbol[-1]

    def extra(self, script: _Script, options: list[Call]) -> None:
        # After a retry the script has used its spare turn: no needless call on top (turn limits).
        if self.rng.random() < self.p_extra and not self.retried:
            name, arguments = self.rng.choice(options)
            script.call(name, arguments)

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
    p_typo: float = 0.0,
) -> list[Message]:
    """A demonstration with a weak agent's mistakes.

    Args:
        task: The task.
        rng: Source of the mistakes (seed it for reproducible demonstrations).
        p_skip_lookup: Per lookup: guess instead of calling the tool (a price within ±50 %, or another
            channel's topic, user, fact or message).
        p_extra_call: Per task: add an unnecessary call (a repeated or irrelevant lookup).
        p_wrong_answer: Per task: give (or post) a plausible wrong value instead of the right one.
        p_typo: Per ticker lookup, at most once per task: first call ``get_quote`` with a mistyped ticker
            (one letter replaced, by one of the other ticker's letters when the task has two), read the
            server's ``Unknown symbol ... Did you mean`` error, then look up the right ticker. The script
            still succeeds; it shows the recovery a model needs when it mis-copies a ticker. The mistyped
            call carries ``"weight": 0`` (OpenAI's fine-tuning convention, honoured by mcprl-train's warm
            start): it is context to recover from, not a target to imitate.

    Returns:
        Chat messages as in :func:`ideal_demo`. With the defaults about 57 % of the demo preset's
        scripts succeed (the package README lists the measured rates).
    """
    for p in (p_skip_lookup, p_extra_call, p_wrong_answer, p_typo):
        if not 0.0 <= p <= 1.0:
            raise ValueError("probabilities must be in [0, 1]")
    return _play(task, _Imperfect(rng, p_skip_lookup, p_extra_call, p_wrong_answer, p_typo))


def with_reasoning(messages: list[Message]) -> list[Message]:
    """``messages`` with a one-line ``reasoning_content`` on each assistant turn that has none, for thinking models.

    A thinking model (Qwen3 with ``enable_thinking``) writes a ``<think>`` block before each turn; its chat
    template renders ``reasoning_content`` there. The line states the turn's own action (the call and its
    arguments, or the answer given), so a demonstration never reasons towards anything it does not do.
    """
    out: list[Message] = []
    for message in messages:
        if message.get("role") != "assistant" or message.get("reasoning_content"):
            out.append(message)
            continue
        calls: list[dict[str, Any]] = message.get("tool_calls") or []
        if calls:
            steps = [
                f"{c['function']['name']} with {json.dumps(c['function']['arguments'], sort_keys=True)}"
                for c in calls
            ]
            reasoning = "Next I call " + " and ".join(steps) + "."
        else:
            content = str(message.get("content") or "")
            answer = content.removeprefix("<answer>").removesuffix("</answer>")
            reasoning = f"The tool results give the answer: {answer}."
        out.append({**message, "reasoning_content": reasoning})
    return out
