"""examples/llm-judge: an LLM judge as the checker of a shortened ``mcprl-train`` run (the real CLI, the demo's
MCP servers).

The judge's endpoint is `chat_server` (packages/mcprl-env/tests): a real HTTP server on a local port speaking
the OpenAI chat-completions API — the one test double, since hosted APIs are unreachable here and a vLLM server
needs a GPU. Its rule: correct when the reference answer occurs in the answer.

The example's tasks are the demo's ``quote`` tasks: half keep their numeric checker and their family, so the
cpu profile's warm start has demonstrations (it teaches the tiny model to end an episode with an answer); the
other half are a user's family (``judged_quote``) checked by the judge, and so is the validation set.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mcprl_env import PythonChecker, TaskSet
from mcprl_env.judge import Judge

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "packages" / "mcprl-env" / "tests"))
from chat_server import chat_server  # pyright: ignore[reportMissingImports]  (sys.path above)

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "llm-judge"


def test_the_example_tasks_name_the_judge(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JUDGE_BASE_URL", "http://127.0.0.1:9/v1")
    train = list(TaskSet(EXAMPLE / "train.jsonl"))
    judged = [t for t in train if isinstance(t.checker, PythonChecker)]
    assert len(judged) == len(train) // 2
    assert all(t.metadata["family"] == "judged_quote" and t.answer for t in judged)
    checker = judged[0].checker
    assert isinstance(checker, PythonChecker)
    assert isinstance(checker.resolved.function, Judge)


@pytest.mark.slow
def test_the_judge_checks_a_training_run_and_its_metrics_are_logged(tmp_path: Path) -> None:
    short = [
        "--set", "sft.steps=50",
        "--set", "run.steps=2",
        "--set", "grpo.tasks_per_step=4",
        "--set", "grpo.group_size=4",
        "--set", "eval.n_tasks=8",
        "--set", f"run.output_dir={tmp_path / 'out'}",
    ]  # fmt: skip
    with chat_server() as server:
        env = {
            **os.environ,
            "WANDB_MODE": "disabled",
            "OMP_NUM_THREADS": "1",
            "JUDGE_BASE_URL": server.base_url,
            "JUDGE_MODEL": "judge-model",
            "JUDGE_CACHE": str(tmp_path / "verdicts.jsonl"),
        }
        cmd = [sys.executable, "-m", "mcprl_train", "--config", "config.yaml", "--run-name", "judged", *short]
        proc = subprocess.run(
            cmd, cwd=EXAMPLE, capture_output=True, text=True, timeout=900, env=env, check=False
        )
        requests = list(server.requests)
    assert proc.returncode == 0, proc.stderr[-4000:]
    run = tmp_path / "out" / "judged"
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    episodes = [json.loads(line) for line in (run / "trajectories.jsonl").read_text().splitlines()]
    assert all(e["valid"] for e in episodes), [e["error"] for e in episodes]
    judged = [r for r in records if "judge/lookups" in r]
    assert {r["kind"] for r in judged} == {"eval", "grpo"}  # validation and training episodes were judged
    for r in judged:
        assert 0.0 <= r["judge/cache_hit_rate"] <= 1.0
        assert r["judge/cache_hits"] + r["judge/calls"] == r["judge/lookups"]
        if r["judge/calls"]:
            assert r["judge/latency_p95_s"] >= r["judge/latency_p50_s"] > 0
    assert sum(r["judge/requests"] for r in judged) == len(requests)  # every request the server saw, counted
    # The cost of each record is the endpoint's usage over its requests (the test server counts words).
    words = [sum(len(m["content"].split()) for m in q["messages"]) for q in requests]
    assert sum(r.get("judge/prompt_tokens", 0.0) for r in judged) == sum(words)
    assert all(r["judge/completion_tokens"] > 0 for r in judged if r["judge/calls"])
    judged_ids = {json.loads(line)["id"] for line in (EXAMPLE / "train.jsonl").read_text().splitlines()[80:]}
    answered = [e for e in episodes if e["task_id"] in judged_ids and e["answer"] is not None]
    assert sum(r["judge/lookups"] for r in judged if r["kind"] == "grpo") == len(answered)
    assert all("Is the assistant's answer the price" in q["messages"][1]["content"] for q in requests)
    cached = (tmp_path / "verdicts.jsonl").read_text().splitlines()
    assert len(cached) == sum(r["judge/calls"] for r in judged) - sum(r["judge/failures"] for r in judged)
    assert all(not e["success"] for e in episodes if e["task_id"] in judged_ids and e["answer"] is None)
