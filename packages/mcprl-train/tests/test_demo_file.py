"""`sft.demos_path`: demonstrations from a JSONL file of chat messages, checked at start-up with line numbers."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import structlog

import mcprl_tasks
from mcprl_train.build import load_demos
from mcprl_train.cli import main
from mcprl_train.config import Config
from mcprl_train.errors import DemonstrationError
from mcprl_train.loop.demo_file import read_demo_file


@pytest.fixture(autouse=True)
def _reset_structlog() -> Iterator[None]:
    """The CLI configures structlog to write to the test's captured output (and a run's log file)."""
    yield
    from mcprl_train.run.tracking import configure_logging

    configure_logging(json_output=True)  # closes a run's log file
    structlog.reset_defaults()


TASKS = mcprl_tasks.read_tasks(mcprl_tasks.load_preset("demo")[0])


def _line(task: dict[str, Any], *, string_arguments: bool = True) -> dict[str, Any]:
    """A task's ideal demonstration as OpenAI's fine-tuning format writes it (ids, JSON-string arguments)."""
    messages: list[dict[str, Any]] = []
    for n, m in enumerate(mcprl_tasks.ideal_demo(task)):
        m = dict(m)
        if m.get("tool_calls"):
            m["tool_calls"] = [
                {
                    "id": f"call_{n}",
                    "type": "function",
                    "function": {
                        "name": c["function"]["name"],
                        "arguments": json.dumps(c["function"]["arguments"])
                        if string_arguments
                        else c["function"]["arguments"],
                    },
                }
                for c in m["tool_calls"]
            ]
        if m["role"] == "tool":
            m["tool_call_id"] = f"call_{n - 1}"
        messages.append(m)
    return {"task_id": task["id"], "messages": messages}


def _write(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def test_a_file_of_openai_chat_messages_reads_as_structured_demonstrations(tmp_path: Path) -> None:
    lines = [json.dumps(_line(t)) for t in TASKS[:3]]
    path = _write(tmp_path / "demos.jsonl", [lines[0], "", lines[1], lines[2]])
    demos = read_demo_file(path, {str(t["id"]) for t in TASKS})
    assert [d.task_id for d in demos] == [str(t["id"]) for t in TASKS[:3]]
    assert [d.source for d in demos] == [f"{path}:1", f"{path}:3", f"{path}:4"]
    assert all(d.succeeds is None for d in demos)
    # JSON-string arguments become objects (what templates that render arguments one by one need).
    for demo, task in zip(demos, TASKS, strict=False):
        ideal = [m for m in mcprl_tasks.ideal_demo(task) if m.get("tool_calls")]
        calls = [m["tool_calls"][0] for m in demo.messages if m.get("tool_calls")]
        assert [c["function"] for c in calls] == [m["tool_calls"][0]["function"] for m in ideal]
        assert all(c["id"].startswith("call_") for c in calls)


GOOD = _line(TASKS[0], string_arguments=False)


def _with(**changes: Any) -> str:
    return json.dumps({**GOOD, **changes})


def _assistant_call(name: str, arguments: object) -> dict[str, Any]:
    return {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"type": "function", "function": {"name": name, "arguments": arguments}}],
    }


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ('{"task_id": "x", "messages": [', r"demos\.jsonl:2: malformed JSON"),
        ("[1, 2]", r"demos\.jsonl:2: expected a JSON object, got list"),
        (_with(task_id="no-such-task"), r"demos\.jsonl:2: unknown task id 'no-such-task'"),
        (_with(task_id=str(TASKS[0]["id"]) + "x"), r"did you mean '" + str(TASKS[0]["id"]) + "'"),
        (
            _with(messages=[{"role": "user", "content": "hi"}]),
            r"demos\.jsonl:2: no assistant turn to train on",
        ),
        (
            _with(
                messages=[
                    {"role": "user", "content": "hi"},
                    {"role": "assistant", "content": "x", "weight": 0},
                ]
            ),
            r"demos\.jsonl:2: no assistant turn to train on",
        ),
        (
            _with(
                tools=[{"type": "function", "function": {"name": "get_quote"}}],
                messages=[{"role": "user", "content": "hi"}, _assistant_call("get_qoute", {"symbol": "A"})],
            ),
            r"demos\.jsonl:2: messages\[1\]\.tool_calls\[0\]: unknown tool 'get_qoute'; the line's tools are \['get_quote'\]",
        ),
        (
            _with(messages=[{"role": "user", "content": "hi"}, _assistant_call("get_quote", "{symbol")]),
            r"demos\.jsonl:2: messages\[1\]\.tool_calls\[0\]: arguments of 'get_quote' are not valid JSON",
        ),
        (
            _with(messages=[{"role": "user", "content": "hi"}, _assistant_call("get_quote", [1])]),
            r"arguments of 'get_quote' must be a JSON object",
        ),
        (
            _with(messages=[{"role": "robot", "content": "hi"}]),
            r"demos\.jsonl:2: messages\[0\]: role must be one of",
        ),
        (_with(prompt="p"), r"demos\.jsonl:2: unknown key\(s\) \['prompt'\]"),
    ],
)
def test_a_bad_line_is_an_error_naming_its_line_and_the_problem(
    tmp_path: Path, bad: str, message: str
) -> None:
    path = _write(tmp_path / "demos.jsonl", [json.dumps(GOOD), bad])
    with pytest.raises(DemonstrationError, match=message):
        read_demo_file(path, {str(t["id"]) for t in TASKS})


def test_an_empty_or_missing_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(DemonstrationError, match="empty"):
        read_demo_file(_write(tmp_path / "demos.jsonl", ["", " "]), {"a"})
    with pytest.raises(FileNotFoundError, match=r"sft\.demos_path: no such file"):
        read_demo_file(tmp_path / "nope.jsonl", {"a"})


def test_file_demonstrations_replace_the_scripted_ones_unless_add_scripted(tmp_path: Path) -> None:
    path = _write(tmp_path / "demos.jsonl", [json.dumps(_line(t)) for t in TASKS[:2]])
    base = ["sft.demos=5", f"sft.demos_path={path}"]
    only = load_demos(Config.load("cpu", overrides=base))
    assert [d.source for d in only] == [f"{path}:1", f"{path}:2"]
    both = load_demos(Config.load("cpu", overrides=[*base, "sft.add_scripted=true"]))
    assert both[:2] == only
    assert [d.source for d in both[2:]] == ["scripted"] * 5
    assert all(d.succeeds is not None for d in both[2:])


def _train_args(tmp_path: Path, demos: Path, *extra: str) -> list[str]:
    return [
        "train",
        "--run-name",
        "r",
        "--set",
        f"run.output_dir={tmp_path / 'runs'}",
        "--set",
        "model.name=tiny",
        "--set",
        f"sft.demos_path={demos}",
        *extra,
    ]


def test_the_cli_refuses_a_call_to_a_tool_the_task_does_not_offer_naming_the_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    line = _line(TASKS[0])
    line["messages"].insert(2, _assistant_call("run_python", {"code": "print(1)"}))
    line["messages"].insert(3, {"role": "tool", "name": "run_python", "content": "1\n"})
    path = _write(tmp_path / "demos.jsonl", [json.dumps(_line(TASKS[1])), json.dumps(line)])
    assert main(_train_args(tmp_path, path)) == 2
    err = capsys.readouterr().err
    [error] = [e for e in err.splitlines() if e.startswith("error:")]
    assert f"demonstration {path}:2 (task {TASKS[0]['id']!r})" in error
    assert "names 'run_python', which the task does not offer" in error
    assert "Traceback" not in err


@pytest.mark.slow
def test_the_cli_warm_starts_on_a_demonstrations_file_then_runs_grpo(tmp_path: Path) -> None:
    path = _write(tmp_path / "demos.jsonl", [json.dumps(_line(t)) for t in TASKS[:8]])
    args = _train_args(
        tmp_path,
        path,
        *("--set", "sft.steps=2", "--set", "sft.batch_size=4", "--set", "run.steps=1"),
        *("--set", "grpo.tasks_per_step=2", "--set", "grpo.group_size=2", "--set", "eval.n_tasks=2"),
        *("--set", "run.checkpoint_every=0"),
    )
    assert main(args) == 0
    summary = json.loads((tmp_path / "runs" / "r" / "summary.json").read_text())
    assert summary["sft_steps"] == 2
    assert summary["steps"] == 1
    assert summary["teacher_success_demos"] is None  # nobody scored the file's demonstrations
    metrics = [
        json.loads(line) for line in (tmp_path / "runs" / "r" / "metrics.jsonl").read_text().splitlines()
    ]
    assert any("sft/loss" in m for m in metrics)


def test_the_cli_stops_on_a_malformed_line_with_one_error_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _write(tmp_path / "demos.jsonl", [json.dumps(GOOD), '{"task_id": "x", "messages": ['])
    assert main(_train_args(tmp_path, path)) == 2
    err = capsys.readouterr().err
    [error] = [e for e in err.splitlines() if e.startswith("error:")]
    assert error.startswith(f"error: {path}:2: malformed JSON")
    assert "Traceback" not in err
