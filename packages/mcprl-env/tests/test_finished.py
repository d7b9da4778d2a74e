"""User checkers and reward functions judge real episodes (scripted sampler, in-process MCP servers)."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import pytest
from env_testkit import call
from structlog.testing import capture_logs

from mcprl_env import (
    EnvConfig,
    Environment,
    Episode,
    FinishedEpisode,
    PythonChecker,
    RewardConfig,
    Task,
    aggregate_metrics,
    task_from_dict,
)
from mcprl_env.episode import EpisodeGroup
from mcprl_env.testing import CharTokenizer, ScriptedSampler
from mcprl_tools import ToolManager

pytestmark = pytest.mark.anyio

USER_CODE = """
import json

SEEN = []


def grade(episode):
    SEEN.append(episode)
    used = any(c.name == "multiply" and c.ok for c in episode.tool_calls)
    return used and episode.answer is not None and episode.answer.strip() == episode.task.answer


async def posted(episode):
    result = await episode.manager.call(
        "messaging.read_messages", {"channel": "ops"}, episode_id=episode.episode_id
    )
    return any("13.5" in m["text"] for m in json.loads(result.text)["messages"])


def boom(episode):
    return {"prices": {}}["prices"]["ACME"]


def maybe(episode):
    return "yes"


def brevity(episode):
    return -len(episode.answer or "") / 100


async def verdict(episode):
    return 2.0 if episode.context.success else 0.5


def broken_reward(episode):
    raise RuntimeError("reward bug")


def nan_reward(episode):
    return float("nan")
"""


@pytest.fixture
def code_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "judge.py").write_text(textwrap.dedent(USER_CODE), encoding="utf-8")
    monkeypatch.chdir(tmp_path)  # reward weight specs resolve from the current directory
    return tmp_path


def task_with(function: str, base_dir: Path, **fields: Any) -> Task:
    raw: dict[str, Any] = {
        "id": "mul-py",
        "prompt": "What is 3 times 4.5? Post it to #ops.",
        "answer": "13.5",
        "checker": {"type": "python", "function": f"judge.py:{function}"},
    }
    raw.update(fields)
    return task_from_dict(raw, base_dir=base_dir)


async def run(
    manager: ToolManager, task: Task, script: list[str], *, namespace: str | None = None, **config: Any
) -> Episode:
    tok = CharTokenizer()
    env = Environment(manager=manager, tokenizer=tok, config=EnvConfig(**config))
    return await env.run_episode(task, ScriptedSampler(tok, script), namespace=namespace)


async def test_checker_sees_the_whole_episode(manager: ToolManager, code_dir: Path) -> None:
    task = task_with("grade", code_dir)
    script = [
        '<tool_call>{"name": "multiply"',
        call("nope"),
        call("multiply", a=3, b=4.5),
        "<answer>13.5</answer>",
    ]
    ep = await run(manager, task, script)
    assert (ep.valid, ep.success, ep.stop_reason) == (True, True, "answer")
    assert ep.reward_components["outcome"] == 1.0
    assert isinstance(task.checker, PythonChecker)
    seen: FinishedEpisode = task.checker.resolved.function.__globals__["SEEN"][-1]
    assert (seen.task, seen.answer, seen.stop_reason, seen.context) == (task, "13.5", "answer", None)
    assert seen.episode_id == ep.episode_id
    assert [dict(m) for m in seen.messages] == ep.messages
    first, second, third = seen.tool_calls
    assert (first.turn, first.name, first.ok, first.error_type) == (1, "", False, "unclosed_tag")
    assert (second.turn, second.name, second.ok, second.error_type) == (2, "nope", False, "unknown_tool")
    assert (third.turn, third.name, dict(third.arguments)) == (3, "multiply", {"a": 3, "b": 4.5})
    assert (third.ok, third.error_type, third.result) == (True, None, "13.5")


async def test_checker_rejects_an_answer_without_the_tool(manager: ToolManager, code_dir: Path) -> None:
    ep = await run(manager, task_with("grade", code_dir), ["<answer>13.5</answer>"])
    assert (ep.valid, ep.success) == (True, False)
    assert ep.reward_components["outcome"] == 0.0


async def test_async_checker_reads_the_servers_state(manager: ToolManager, code_dir: Path) -> None:
    task = task_with("posted", code_dir)
    posted = await run(manager, task, [call("post_message", channel="ops", text="13.5"), "done"])
    assert (posted.valid, posted.success) == (True, True)
    silent = await run(manager, task, ["done"], namespace="other")  # fresh server state
    assert (silent.valid, silent.success) == (True, False)


async def test_a_raising_checker_makes_the_episode_invalid_not_wrong(
    manager: ToolManager, code_dir: Path
) -> None:
    with capture_logs() as logs:
        ep = await run(manager, task_with("boom", code_dir), ["<answer>13.5</answer>"])
    assert (ep.valid, ep.success, ep.reward, ep.stop_reason) == (False, False, 0.0, "user_code_error")
    assert set(ep.reward_components.values()) == {0.0}
    assert ep.error is not None
    assert "task 'mul-py'" in ep.error
    assert "judge.py:boom raised KeyError" in ep.error
    (event,) = [e for e in logs if e["event"] == "user_code_error"]
    assert (event["task_id"], event["function"], event["log_level"]) == ("mul-py", "judge.py:boom", "error")
    assert 'in boom\n    return {"prices": {}}["prices"]["ACME"]' in event["traceback"]
    metrics = aggregate_metrics([EpisodeGroup(group_id="g", task=task_with("boom", code_dir), episodes=[ep])])
    assert metrics["rollout/stop/user_code_error"] == 1.0
    assert metrics["rollout/invalid_episodes"] == 1.0


async def test_a_checker_returning_a_non_bool_is_a_user_code_error(
    manager: ToolManager, code_dir: Path
) -> None:
    ep = await run(manager, task_with("maybe", code_dir), ["<answer>13.5</answer>"])
    assert (ep.valid, ep.stop_reason) == (False, "user_code_error")
    assert ep.error is not None
    assert "returned 'yes' (str); a checker returns True or False" in ep.error


async def test_user_reward_functions_are_weighted_components(manager: ToolManager, code_dir: Path) -> None:
    weights = {"outcome": 1.0, "judge.py:brevity": 0.5, "judge.py:verdict": 0.25}
    reward = RewardConfig(weights=weights)
    task = task_with("grade", code_dir)
    ep = await run(manager, task, [call("multiply", a=3, b=4.5), "<answer>13.5</answer>"], reward=reward)
    assert ep.valid
    assert ep.reward_components == {
        "outcome": 1.0,
        "judge.py:brevity": pytest.approx(0.5 * -4 / 100),
        "judge.py:verdict": 0.25 * 2.0,
    }
    assert ep.reward == pytest.approx(1.0 - 0.02 + 0.5)
    wrong = await run(manager, task, ["<answer>12</answer>"], reward=reward)
    assert wrong.reward_components["judge.py:verdict"] == 0.25 * 0.5


@pytest.mark.parametrize(
    ("function", "message"),
    [
        ("broken_reward", "judge.py:broken_reward raised RuntimeError: reward bug"),
        ("nan_reward", "judge.py:nan_reward returned nan (float); a reward function returns a finite number"),
    ],
)
async def test_a_failing_reward_function_makes_the_episode_invalid(
    manager: ToolManager, code_dir: Path, function: str, message: str
) -> None:
    reward = RewardConfig(weights={"outcome": 1.0, f"judge.py:{function}": 1.0})
    ep = await run(manager, task_with("grade", code_dir), ["<answer>13.5</answer>"], reward=reward)
    assert (ep.valid, ep.reward, ep.stop_reason) == (False, 0.0, "user_code_error")
    assert ep.error is not None
    assert message in ep.error
