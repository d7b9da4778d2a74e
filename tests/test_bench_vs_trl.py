"""The TRL side of ``benchmarks/bench_vs_trl.py`` runs one real GRPO step (TRL's interpreter: ``TRL_PYTHON``)."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from mcprl_policy import build_tiny_model

ROOT = Path(__file__).resolve().parent.parent
TRL_PYTHON = os.environ.get("TRL_PYTHON", "/tmp/trlenv/bin/python")


def _trl_importable() -> bool:
    probe = [TRL_PYTHON, "-c", "import trl, mcp, mcprl_tasks, mcprl_env"]
    return Path(TRL_PYTHON).exists() and subprocess.run(probe, capture_output=True).returncode == 0


@pytest.mark.slow
@pytest.mark.skipif(
    not _trl_importable(),
    reason=f"no TRL interpreter at TRL_PYTHON={TRL_PYTHON} (see benchmarks/trl_grpo.py's docstring to make one)",
)
def test_trl_side_trains_one_step_over_the_real_servers_and_saves_the_weights(tmp_path: Path) -> None:
    model = build_tiny_model("tiny-8h", cache_dir=tmp_path / "models")
    tasks = tmp_path / "tasks.json"
    demo = json.loads((ROOT / "apps/mcprl-tasks/src/mcprl_tasks/data/demo/train.json").read_text())
    # One task of each server set: every TRL environment class is built and rendered.
    by_servers = {tuple(t["servers"]): t for t in demo}
    tasks.write_text(json.dumps(list(by_servers.values())))
    out = tmp_path / "trl"
    cmd = [
        TRL_PYTHON,
        str(ROOT / "benchmarks/trl_grpo.py"),
        *("--model", str(model), "--tasks", str(tasks), "--out", str(out)),
        *("--steps", "1", "--tasks-per-step", "1", "--group-size", "2", "--lr", "3e-4", "--save-every", "1"),
        *("--max-completion-length", "48", "--max-tool-iterations", "1"),
    ]
    env = {**os.environ, "TRL_EXPERIMENTAL_SILENCE": "1"}
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    steps = [json.loads(line) for line in (out / "steps.jsonl").read_text().splitlines()]
    assert [s["step"] for s in steps] == [1]
    assert steps[0]["wall_s"] > 0
    assert steps[0]["cpu_s"] > 0
    saved = out / "step-1"
    assert (saved / "model.safetensors").is_file()
    assert (saved / "tokenizer.json").is_file()
    config = json.loads((out / "config.json").read_text())
    assert config["num_generations"] == 2
    assert config["beta"] == 0.0
    assert config["loss_type"] == "dapo"
    history = json.loads((out / "log_history.json").read_text())
    assert any("rewards/mcprl_reward/mean" in h for h in history)


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _quote_task() -> dict[str, Any]:
    demo = json.loads((ROOT / "apps/mcprl-tasks/src/mcprl_tasks/data/demo/validation.json").read_text())
    return next(t for t in demo if t["metadata"]["family"] == "quote")


def test_a_trl_completion_that_answers_right_gets_mcprls_full_reward() -> None:
    trl_grpo = _load("trl_grpo")
    task = _quote_task()
    call = {"type": "function", "function": {"name": "get_quote", "arguments": {"symbol": "X"}}}
    messages = [
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "name": "get_quote", "content": '{"price": 1}'},
        {"role": "assistant", "content": f"<answer>{task['answer']}</answer>"},
    ]
    env = trl_grpo.FinanceEnv()
    env.reset()
    env.calls_ok = 1
    # outcome 1 + format 0.1 + tool_success 0.1 (RewardConfig's default weights)
    assert trl_grpo.episode_reward(task, messages, env, 4) == pytest.approx(1.2)


def test_an_unparsed_call_is_a_parse_error_and_a_forced_stop() -> None:
    trl_grpo = _load("trl_grpo")
    task = _quote_task()
    messages = [{"role": "assistant", "content": '<tool_call>{"name": get_quote}</tool_call>'}]
    env = trl_grpo.FinanceEnv()
    env.reset()
    # invalid_call -0.1 * min(1, 1/3), forced -0.2
    assert trl_grpo.episode_reward(task, messages, env, 4) == pytest.approx(-0.1 / 3 - 0.2)


def _side(bench: ModuleType, name: str, points: list[tuple[int, float, float]]) -> Any:
    curve = [bench.Point(step=s, wall_s=w, cpu_s=w / 2, success=r) for s, w, r in points]
    return bench.Side(name=name, step_wall_s=[1.0], step_cpu_s=[1.0], step_tokens=[1.0], curve=curve)


def test_the_headline_is_trls_time_to_the_rate_both_reach_over_mcprls() -> None:
    bench = _load("bench_vs_trl")
    mcprl = _side(bench, "mcprl", [(0, 0.0, 0.2), (5, 10.0, 0.5), (10, 20.0, 0.7)])
    trl = _side(bench, "TRL", [(0, 0.0, 0.2), (5, 40.0, 0.3), (10, 80.0, 0.5)])
    wall, cpu, both, _ = bench.speedup(mcprl, trl)
    assert both == pytest.approx(0.5)
    assert wall == pytest.approx(8.0)
    assert cpu == pytest.approx(8.0)


def test_no_rate_both_reach_gives_nan_and_says_why() -> None:
    bench = _load("bench_vs_trl")
    mcprl = _side(bench, "mcprl", [(0, 0.0, 0.2), (5, 10.0, 0.5)])
    trl = _side(bench, "TRL", [(0, 0.0, 0.2), (5, 40.0, 0.1)])
    wall, cpu, both, why = bench.speedup(mcprl, trl)
    assert math.isnan(wall)
    assert math.isnan(cpu)
    assert both is None
    assert "start" in why


def test_a_call_without_its_required_arguments_is_invalid_not_a_crash() -> None:
    trl_grpo = _load("trl_grpo")
    demo = json.loads((ROOT / "apps/mcprl-tasks/src/mcprl_tasks/data/demo/validation.json").read_text())
    task = next(t for t in demo if t["checker"]["type"] == "message_posted")
    call = {"type": "function", "function": {"name": "post_message", "arguments": {"text": "1"}}}
    messages = [
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "name": "post_message", "content": "{'error': 'missing channel'}"},
        {"role": "assistant", "content": "<answer>done</answer>"},
    ]
    env = trl_grpo.FinanceMessagingEnv()
    env.reset()
    # format 0.1, tool_success 0 (0 of 1 ok), invalid_call -0.1 / 3; not a success
    assert trl_grpo.episode_reward(task, messages, env, 5) == pytest.approx(0.1 - 0.1 / 3)
