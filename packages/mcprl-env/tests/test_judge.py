"""The LLM judge against a real local HTTP server speaking the chat-completions API (`chat_server`).

Hosted APIs are unreachable here and a vLLM server needs a GPU, so the endpoint is a small threaded
``http.server`` app on a local port: the judge's requests, retries, timeouts and concurrency limit go over
real sockets. The checker path runs real episodes (scripted sampler, in-memory MCP servers).
"""

from __future__ import annotations

import json
import pickle
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from chat_server import ChatServer, chat_server
from structlog.testing import capture_logs

from mcprl_env import (
    EnvConfig,
    Environment,
    FinishedEpisode,
    PythonChecker,
    RewardConfig,
    Task,
    task_from_dict,
)
from mcprl_env.errors import ConfigError, JudgeError
from mcprl_env.finished import ToolCallRecord
from mcprl_env.judge import DEFAULT_RUBRIC, Judge, judge_metrics
from mcprl_env.testing import CharTokenizer, ScriptedSampler
from mcprl_tools import ToolManager

pytestmark = pytest.mark.anyio


@pytest.fixture
def server() -> Iterator[ChatServer]:
    judge_metrics()  # counters of judges left by earlier tests
    with chat_server() as s:
        yield s


def make_judge(server: ChatServer, **fields: Any) -> Judge:
    defaults: dict[str, Any] = {"base_url": server.base_url, "model": "judge-model", "backoff_s": 0.01}
    return Judge(**(defaults | fields))


def episode(
    manager: ToolManager, answer: str | None, *, task_id: str = "t1", reference: str = "42"
) -> FinishedEpisode:
    task = task_from_dict({"id": task_id, "prompt": "What is 6 times 7?", "answer": reference})
    calls = (
        ToolCallRecord(
            turn=1, name="multiply", arguments={"a": 6, "b": 7}, ok=True, error_type=None, result="42"
        ),
    )
    return FinishedEpisode(
        task=task,
        episode_id=f"{task_id}-e0",
        messages=(),
        answer=answer,
        tool_calls=calls,
        stop_reason="answer",
        manager=manager,
    )


async def test_correct_and_incorrect_answers_get_the_servers_verdicts(
    server: ChatServer, manager: ToolManager
) -> None:
    judge = make_judge(server)
    assert await judge(episode(manager, "It is 42.")) is True
    assert await judge(episode(manager, "41")) is False
    first = server.requests[0]
    assert (first["model"], first["temperature"]) == ("judge-model", 0.0)
    assert first["messages"][1]["content"] == DEFAULT_RUBRIC.replace("$prompt", "What is 6 times 7?").replace(
        "$reference", "42"
    ).replace("$answer", "It is 42.")
    assert "Authorization" not in server.headers_seen[0]


async def test_an_identical_judgment_is_answered_from_the_cache(
    server: ChatServer, manager: ToolManager
) -> None:
    judge = make_judge(server)
    assert await judge(episode(manager, "42", task_id="a")) is True
    assert await judge(episode(manager, "42", task_id="a")) is True
    assert len(server.requests) == 1
    await judge(episode(manager, "42", task_id="b"))  # the same request under another id: the same key
    assert len(server.requests) == 1
    await judge(episode(manager, "42", task_id="c", reference="41"))  # another reference: another key
    assert len(server.requests) == 2
    metrics = judge_metrics()
    assert (metrics["judge/lookups"], metrics["judge/cache_hits"], metrics["judge/calls"]) == (4, 2, 2)
    assert metrics["judge/cache_hit_rate"] == 0.5
    assert metrics["judge/latency_p95_s"] >= metrics["judge/latency_p50_s"] > 0
    assert judge_metrics() == {}  # drained


async def test_identical_judgments_in_flight_together_send_one_request(
    server: ChatServer, manager: ToolManager
) -> None:
    server.delay_s = 0.2
    judge = make_judge(server)
    async with anyio.create_task_group() as tg:
        for _ in range(4):
            tg.start_soon(judge, episode(manager, "42"))
    assert len(server.requests) == 1
    assert judge_metrics()["judge/cache_hits"] == 3


async def test_the_disk_cache_survives_a_new_judge(
    server: ChatServer, manager: ToolManager, tmp_path: Path
) -> None:
    cache = tmp_path / "verdicts.jsonl"
    assert await make_judge(server, cache_path=cache)(episode(manager, "42")) is True
    assert await make_judge(server, cache_path=cache)(episode(manager, "42")) is True
    assert len(server.requests) == 1
    (row,) = [json.loads(line) for line in cache.read_text().splitlines()]
    assert (row["model"], row["correct"]) == ("judge-model", True)
    rubric = make_judge(server, cache_path=cache, rubric="Strict now. Answer: $answer")
    await rubric(episode(manager, "42"))  # another rubric: another key
    assert len(server.requests) == 2


async def test_the_concurrency_limit_is_what_the_server_sees(
    server: ChatServer, manager: ToolManager
) -> None:
    server.delay_s = 0.15
    judge = make_judge(server, max_concurrency=2)
    async with anyio.create_task_group() as tg:
        for i in range(6):
            tg.start_soon(judge, episode(manager, f"4{i}"))
    assert len(server.requests) == 6
    assert server.max_in_flight == 2


async def test_a_server_error_is_retried(server: ChatServer, manager: ToolManager) -> None:
    server.replies = [(500, None), (429, None)]
    judge = make_judge(server, max_retries=2)
    assert await judge(episode(manager, "42")) is True
    assert len(server.requests) == 3
    metrics = judge_metrics()
    assert (metrics["judge/calls"], metrics["judge/requests"], metrics["judge/failures"]) == (1, 3, 0)


async def test_a_client_error_is_not_retried(server: ChatServer, manager: ToolManager) -> None:
    server.replies = [(404, None)]
    with pytest.raises(JudgeError, match="HTTP 404"):
        await make_judge(server, max_retries=3)(episode(manager, "42"))
    assert len(server.requests) == 1


async def test_a_timeout_after_the_retries_is_a_judge_error(server: ChatServer, manager: ToolManager) -> None:
    server.delay_s = 1.0
    judge = make_judge(server, timeout_s=0.2, max_retries=1)
    with capture_logs() as logs, pytest.raises(JudgeError, match=r"after 2 attempts: timed out after 0\.2 s"):
        await judge(episode(manager, "42"))
    assert len(server.requests) == 2
    assert [e["event"] for e in logs] == ["judge_error"]
    assert judge_metrics()["judge/failures"] == 1


async def test_a_malformed_verdict_is_retried_then_fails(server: ChatServer, manager: ToolManager) -> None:
    server.replies = [(200, "Yes, correct."), (200, '{"correct": "yes", "reason": "x"}')]
    judge = make_judge(server, max_retries=1)
    with pytest.raises(JudgeError, match="malformed verdict: 'correct' must be true/false"):
        await judge(episode(manager, "42"))
    server.replies = [(200, "PASS")]
    assert await judge(episode(manager, "42")) is True  # not cached as a failure: the retry is answered
    metrics = judge_metrics()
    assert metrics["judge/malformed"] == 3
    # Every reply the endpoint sent is billed, the malformed ones too: the server counts words as tokens.
    words = sum(len(m["content"].split()) for m in server.requests[0]["messages"])
    assert all(sum(len(m["content"].split()) for m in q["messages"]) == words for q in server.requests)
    assert len(server.requests) == 4
    assert metrics["judge/prompt_tokens"] == 4 * words
    good = json.dumps({"correct": True, "reason": "matches the reference"})  # the server's verdict
    replies = ["Yes, correct.", '{"correct": "yes", "reason": "x"}', "PASS", good]
    assert metrics["judge/completion_tokens"] == sum(len(r.split()) for r in replies)
    assert metrics["judge/prompt_tokens_mean"] == words


async def test_no_answer_is_incorrect_without_a_request(server: ChatServer, manager: ToolManager) -> None:
    assert await make_judge(server)(episode(manager, None)) is False
    assert server.requests == []


async def test_the_rubric_renders_tool_calls_and_the_key_comes_from_the_environment(
    server: ChatServer, manager: ToolManager, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rubric = tmp_path / "rubric.md"
    rubric.write_text("Task $task_id: $prompt\nCalls:\n$tool_calls\nAnswer: $answer\nCost: $$5\n")
    monkeypatch.setenv("JUDGE_TEST_KEY", "sk-test-123")
    thinking_off = {"chat_template_kwargs": {"enable_thinking": False}}
    judge = make_judge(
        server, rubric=rubric, api_key_env="JUDGE_TEST_KEY", json_mode=True, extra_body=thinking_off
    )
    server.replies = [(200, '{"correct": true, "reason": "used the tool"}')]
    assert await judge(episode(manager, "42")) is True
    assert server.requests[0]["messages"][1]["content"] == (
        'Task t1: What is 6 times 7?\nCalls:\n1. multiply({"a": 6, "b": 7}) -> ok: 42\nAnswer: 42\nCost: $5\n'
    )
    assert server.headers_seen[0]["Authorization"] == "Bearer sk-test-123"
    assert server.requests[0]["response_format"] == {"type": "json_object"}
    assert server.requests[0]["chat_template_kwargs"] == {"enable_thinking": False}
    assert "sk-test-123" not in repr(judge)


def test_bad_configuration_is_refused_at_construction(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("JUDGE_MISSING_KEY", raising=False)
    cases: list[tuple[dict[str, Any], str]] = [
        ({"rubric": "Is it right?"}, r"must place the answer \(\$answer\)"),
        ({"rubric": "$answer vs $gold"}, r"unknown placeholder\(s\) \['gold'\]"),
        ({"rubric": "$answer costs $ 5"}, "write '\\$\\$' for a dollar sign"),
        ({"base_url": "localhost:8000"}, "expected http"),
        ({"api_key_env": "JUDGE_MISSING_KEY"}, "JUDGE_MISSING_KEY is not set"),
    ]
    for fields, why in cases:
        with pytest.raises(ConfigError, match=why):
            Judge(**({"base_url": "http://127.0.0.1:9/v1", "model": "m"} | fields))  # pyright: ignore[reportArgumentType]


JUDGE_FILE = """
from mcprl_env.judge import Judge

judge = Judge(base_url={url!r}, model="judge-model", timeout_s={timeout}, max_retries=0)
"""


def judged_task(tmp_path: Path, url: str, *, timeout: float = 5.0) -> Task:
    (tmp_path / "judging.py").write_text(textwrap.dedent(JUDGE_FILE.format(url=url, timeout=timeout)))
    raw = {"id": "judged", "prompt": "What is 3 times 4.5?", "answer": "13.5"}
    return task_from_dict(
        raw | {"checker": {"type": "python", "function": "judging.py:judge"}}, base_dir=tmp_path
    )


async def run(manager: ToolManager, task: Task, answer: str) -> Any:
    tok = CharTokenizer()
    env = Environment(manager=manager, tokenizer=tok, config=EnvConfig())
    return await env.run_episode(task, ScriptedSampler(tok, [f"<answer>{answer}</answer>"]))


async def test_the_judge_is_an_episodes_checker(
    server: ChatServer, manager: ToolManager, tmp_path: Path
) -> None:
    task = judged_task(tmp_path, server.base_url)
    good, bad = await run(manager, task, "13.5"), await run(manager, task, "12")
    assert (good.valid, good.success, good.reward_components["outcome"]) == (True, True, 1.0)
    assert (bad.valid, bad.success, bad.reward_components["outcome"]) == (True, False, 0.0)


async def test_a_failed_judgment_makes_the_episode_invalid_not_wrong(
    server: ChatServer, manager: ToolManager, tmp_path: Path
) -> None:
    server.replies = [(503, None)]
    ep = await run(manager, judged_task(tmp_path, server.base_url), "13.5")
    assert (ep.valid, ep.stop_reason) == (False, "infra_error")
    assert ep.error is not None
    assert "judging.py:judge" in ep.error
    assert "HTTP 503" in ep.error


def test_a_judged_task_pickles_to_the_live_judge(tmp_path: Path) -> None:
    task = judged_task(tmp_path, "http://127.0.0.1:9/v1")
    again = pickle.loads(pickle.dumps(task))  # DeepSpeed all-gathers episode groups, their tasks included
    assert again == task
    assert isinstance(again.checker, PythonChecker)
    assert isinstance(task.checker, PythonChecker)
    assert again.checker.resolved.function is task.checker.resolved.function
    other = pickle.loads(pickle.dumps(Judge(base_url="http://127.0.0.1:9/v1", model="other", max_retries=5)))
    assert (other.model, other.max_retries) == ("other", 5)


async def test_a_user_reward_function_can_report_an_infrastructure_failure(
    manager: ToolManager, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "scoring_infra.py").write_text(
        "from mcprl_env import CheckerInfraError\n\n"
        "def style(episode):\n    raise CheckerInfraError('the style endpoint is down')\n"
    )
    monkeypatch.chdir(tmp_path)  # reward weight specs resolve from the current directory
    task = task_from_dict({"id": "plain", "prompt": "What is 3 times 4.5?", "answer": "13.5"})
    tok = CharTokenizer()
    weights = {"outcome": 1.0, "scoring_infra.py:style": 0.5}
    env = Environment(manager=manager, tokenizer=tok, config=EnvConfig(reward=RewardConfig(weights=weights)))
    ep = await env.run_episode(task, ScriptedSampler(tok, ["<answer>13.5</answer>"]))
    assert (ep.valid, ep.success, ep.stop_reason) == (False, False, "infra_error")
    assert ep.error == "reward: the style endpoint is down"
