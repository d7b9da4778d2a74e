"""The walk-through of docs/own-task-family.md: a user's task family trained from the CLI, no mcprl code changed.

``examples/net-margin`` holds what a user writes: task files, a Python checker beside them
(``margin_checks.py``) and a config naming the bundled ``search`` and ``python`` servers and a user reward term.
The first tests judge scripted episodes with that checker against the real servers (stdio subprocesses), so
the checker is shown to accept a grounded answer and to reject a guess; the last runs the walk-through's
command, shortened to two GRPO steps.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from pathlib import Path

import attrs
import pytest
from e2e_testkit import run_cli

from mcprl_env import Environment, Episode, PythonChecker, Task, TaskSet
from mcprl_env.testing import CharTokenizer, ScriptedSampler
from mcprl_servers.corpus import load_corpus
from mcprl_tools import ToolManager
from mcprl_train import build
from mcprl_train.config import Config

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "net-margin"


def tool_call(name: str, **arguments: object) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


def true_margin(doc_id: str) -> float:
    (doc,) = [d for d in load_corpus() if d["doc_id"] == doc_id]
    revenue, income = re.findall(r"\$([\d,.]+) million", doc["text"])
    return 100 * float(income.replace(",", "")) / float(revenue.replace(",", ""))


@pytest.fixture
def config(monkeypatch: pytest.MonkeyPatch) -> Config:
    monkeypatch.chdir(EXAMPLE)  # the walk-through runs from the example's directory
    return Config.load(config_file="config.yaml")


@pytest.fixture
def task() -> Task:
    return next(iter(TaskSet(EXAMPLE / "train.jsonl")))


@pytest.fixture
async def manager(config: Config) -> AsyncIterator[ToolManager]:
    async with ToolManager(build.servers_config(config)) as m:
        yield m


async def judge(manager: ToolManager, config: Config, task: Task, script: list[str], tag: str) -> Episode:
    tok = CharTokenizer()  # one token per character: the budgets are widened to fit
    budgets = attrs.evolve(
        config.env, max_total_tokens=32768, max_new_tokens_per_turn=1024, max_tool_output_tokens=4096
    )
    env = Environment(manager=manager, tokenizer=tok, config=budgets)
    return await env.run_episode(task, ScriptedSampler(tok, script), namespace=tag)


@pytest.mark.anyio
async def test_the_example_checker_accepts_a_grounded_answer_and_rejects_guesses(
    manager: ToolManager, config: Config, task: Task
) -> None:
    assert isinstance(task.checker, PythonChecker)
    assert task.checker.resolved.origin == str(EXAMPLE / "margin_checks.py")
    doc_id = task.metadata["doc_id"]
    margin = true_margin(doc_id)
    code = f"print(round({margin!r}, 1))"
    fetch, run = tool_call("fetch_document", doc_id=doc_id), tool_call("run_python", code=code)

    grounded = await judge(manager, config, task, [fetch, run, f"<answer>{margin:.1f}</answer>"], "grounded")
    assert (grounded.valid, grounded.success, grounded.stop_reason) == (True, True, "answer")
    assert grounded.messages[4]["content"].strip() == f"{margin:.1f}"  # the sandbox really ran the code
    assert grounded.reward_components["margin_checks.py:used_python"] == pytest.approx(0.1)
    assert grounded.reward_components["outcome"] == 1.0

    guessed = await judge(manager, config, task, [f"<answer>{margin:.1f}</answer>"], "guessed")
    assert (guessed.valid, guessed.success) == (True, False)
    assert guessed.reward_components["margin_checks.py:used_python"] == 0.0

    wrong = await judge(manager, config, task, [fetch, f"<answer>{margin + 0.2:.1f}</answer>"], "wrong")
    assert (wrong.valid, wrong.success) == (True, False)


@pytest.mark.slow
def test_the_walkthrough_trains_from_the_cli(tmp_path: Path) -> None:
    short = [
        "--set", "run.steps=2",
        "--set", "grpo.tasks_per_step=2",
        "--set", "grpo.group_size=2",
        "--set", "eval.n_tasks=2",
        "--set", f"run.output_dir={tmp_path}",
    ]  # fmt: skip
    proc = run_cli("--config", "config.yaml", "--run-name", "walk", *short, cwd=EXAMPLE)
    assert proc.returncode == 0, proc.stderr[-4000:]
    run = tmp_path / "walk"
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if r["kind"] == "grpo"] == [1, 2]
    assert all("reward/margin_checks.py:used_python_mean" in r for r in records if r["kind"] == "grpo")
    episodes = [json.loads(line) for line in (run / "trajectories.jsonl").read_text().splitlines()]
    assert len(episodes) == 2 * 2 * 2
    assert {e["task_id"] for e in episodes} <= {t.id for t in TaskSet(EXAMPLE / "train.jsonl")}
    assert all(e["valid"] and e["stop_reason"] != "user_code_error" for e in episodes), [
        e["error"] for e in episodes
    ]
    assert all("margin_checks.py:used_python" in e["reward_components"] for e in episodes)
    summary = json.loads((run / "summary.json").read_text())
    assert (summary["steps"], summary["sft_steps"]) == (2, 0)
