"""The LLM judge as the checker of a shortened ``mcprl-train`` run (the real CLI, the demo's MCP servers).

The judge's endpoint is `chat_server` (packages/mcprl-env/tests): a real HTTP server on a local port speaking
the OpenAI chat-completions API — the one test double, since hosted APIs are unreachable here and a vLLM server
needs a GPU. Its rule: correct when the reference answer occurs in the answer.

The tasks are the demo's ``quote`` tasks: half keep their numeric checker and their family, so the cpu profile's
warm start has demonstrations (it teaches the tiny model to end an episode with an answer); the other half are
a user's family (``judged_quote``) checked by the judge, and so is the validation set.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "packages" / "mcprl-env" / "tests"))
from chat_server import chat_server  # pyright: ignore[reportMissingImports]  (sys.path above)

DEMO = Path(__file__).resolve().parents[1] / "apps" / "mcprl-tasks" / "src" / "mcprl_tasks" / "data" / "demo"

JUDGING = """\
import os
from pathlib import Path

from mcprl_env.judge import Judge

judge = Judge(
    base_url=os.environ["JUDGE_BASE_URL"],
    model="judge-model",
    rubric=Path(__file__).with_name("rubric.md"),
    max_concurrency=2,
    timeout_s=30,
)
"""

RUBRIC = """\
Is the assistant's answer the price asked for?

Task:
$prompt

Reference answer (may be empty): $reference

Assistant's final answer:
$answer
"""


def write_tasks(source: Path, target: Path, n: int, *, judged_from: int) -> None:
    tasks = [t for t in json.loads(source.read_text()) if t["metadata"]["family"] == "quote"][:n]
    for t in tasks[judged_from:]:
        t["checker"] = {"type": "python", "function": "judging.py:judge"}
        t["metadata"]["family"] = "judged_quote"
    target.write_text("".join(json.dumps(t) + "\n" for t in tasks))


@pytest.mark.slow
def test_the_judge_checks_a_training_run_and_its_metrics_are_logged(tmp_path: Path) -> None:
    work = tmp_path / "family"
    work.mkdir()
    write_tasks(DEMO / "train.json", work / "train.jsonl", 160, judged_from=80)
    write_tasks(DEMO / "validation.json", work / "validation.jsonl", 8, judged_from=0)
    (work / "judging.py").write_text(JUDGING)
    (work / "rubric.md").write_text(RUBRIC)
    (work / "config.yaml").write_text("tasks:\n  train: train.jsonl\n  validation: validation.jsonl\n")
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
        }
        cmd = [sys.executable, "-m", "mcprl_train", "--config", "config.yaml", "--run-name", "judged", *short]
        proc = subprocess.run(
            cmd, cwd=work, capture_output=True, text=True, timeout=900, env=env, check=False
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
    judged_ids = {json.loads(line)["id"] for line in (work / "train.jsonl").read_text().splitlines()[80:]}
    answered = [e for e in episodes if e["task_id"] in judged_ids and e["answer"] is not None]
    assert sum(r["judge/lookups"] for r in judged if r["kind"] == "grpo") == len(answered)
    assert all("Is the assistant's answer the price" in q["messages"][1]["content"] for q in requests)
    assert all(not e["success"] for e in episodes if e["task_id"] in judged_ids and e["answer"] is None)
