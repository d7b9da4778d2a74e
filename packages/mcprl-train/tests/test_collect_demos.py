"""`mcprl-train collect-demos`: rejection sampling through the real tool servers and the tasks' checkers.

The stronger model is a test double: a local HTTP server speaking the chat-completions API (hosted APIs and
model weights are unreachable here). It plays each task's ideal script, except that it answers one task wrongly
and calls a tool another task does not offer; the real servers answer the calls and the real checkers score.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import structlog

import mcprl_tasks
from mcprl_train.cli import main
from mcprl_train.loop.demo_file import read_demo_file


@pytest.fixture(autouse=True)
def _reset_structlog() -> Iterator[None]:
    """The CLI configures structlog to write to the test's captured output (and a run's log file)."""
    yield
    from mcprl_train.run.tracking import configure_logging

    configure_logging(json_output=True)  # closes a run's log file
    structlog.reset_defaults()


TASKS = mcprl_tasks.read_tasks(mcprl_tasks.load_preset("demo")[0])[:4]
WRONG, STRAY = str(TASKS[2]["id"]), str(TASKS[1]["id"])  # a numeric checker; a post_quote task


def _reply(request: dict[str, Any]) -> dict[str, Any]:
    """The next assistant message of the task's ideal script (OpenAI wire format), with the planted mistakes."""
    prompt = next(m["content"] for m in request["messages"] if m["role"] == "user")
    task = next(t for t in TASKS if t["prompt"] == prompt)
    turn = sum(m["role"] == "assistant" for m in request["messages"])
    script = [m for m in mcprl_tasks.ideal_demo(task) if m["role"] == "assistant"]
    message = dict(script[turn])
    if message.get("tool_calls"):
        name = "run_python" if str(task["id"]) == STRAY else message["tool_calls"][0]["function"]["name"]
        arguments = json.dumps(message["tool_calls"][0]["function"]["arguments"])
        message["tool_calls"] = [
            {"id": f"call_{turn}", "type": "function", "function": {"name": name, "arguments": arguments}}
        ]
    elif str(task["id"]) == WRONG:
        message["content"] = "<answer>-1</answer>"
    return {"choices": [{"index": 0, "message": message, "finish_reason": "stop"}]}


@pytest.fixture
def endpoint() -> Iterator[tuple[str, list[dict[str, Any]]]]:
    requests: list[dict[str, Any]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            assert self.path == "/v1/chat/completions"
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            requests.append(body)
            data = json.dumps(_reply(body)).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: object) -> None:
            return None

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1", requests
    finally:
        server.shutdown()
        thread.join()


def test_collect_demos_keeps_only_the_episodes_the_checker_accepts(
    endpoint: tuple[str, list[dict[str, Any]]], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url, requests = endpoint
    out = tmp_path / "demos.jsonl"
    args = ["collect-demos", "--base-url", url, "--model", "m", "--out", str(out), "--max-tasks", "4"]
    assert main([*args, "--attempts", "2"]) == 0
    printed = capsys.readouterr().out
    assert "2 of 4 tasks solved in 6 episodes" in printed, printed[-300:]
    demos = read_demo_file(out, {str(t["id"]) for t in TASKS})
    assert sorted(d.task_id for d in demos) == sorted(
        str(t["id"]) for t in TASKS if t["id"] not in (WRONG, STRAY)
    )
    for demo in demos:
        task = next(t for t in TASKS if str(t["id"]) == demo.task_id)
        ideal = mcprl_tasks.ideal_demo(task)
        # The servers' real results, byte for byte what the scripted demonstration simulates.
        assert [m["content"] for m in demo.messages] == [m["content"] for m in ideal]
        calls = [m["tool_calls"][0]["function"] for m in demo.messages if m.get("tool_calls")]
        assert calls == [m["tool_calls"][0]["function"] for m in ideal if m.get("tool_calls")]
        assert mcprl_tasks.demo_succeeds(task, demo.messages)
    # Every request offered the task's tools and sent earlier calls' arguments as JSON strings.
    assert all(r["model"] == "m" and r["tools"] for r in requests)
    sent = [c for r in requests for m in r["messages"] for c in m.get("tool_calls", [])]
    assert sent
    assert all(isinstance(c["function"]["arguments"], str) for c in sent)


def test_collect_demos_reports_an_unreachable_endpoint(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = [
        "collect-demos",
        "--base-url",
        "http://127.0.0.1:9/v1",
        "--model",
        "m",
        "--out",
        str(tmp_path / "d"),
    ]
    assert main([*args, "--max-tasks", "1"]) == 2
    [error] = [e for e in capsys.readouterr().err.splitlines() if e.startswith("error:")]
    assert "http://127.0.0.1:9/v1/chat/completions: ConnectError" in error


def test_collect_demos_needs_the_named_api_key(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = [
        "collect-demos",
        "--base-url",
        "http://127.0.0.1:9/v1",
        "--model",
        "m",
        "--out",
        str(tmp_path / "d"),
    ]
    assert main([*args, "--api-key-env", "MCPRL_TEST_NO_SUCH_KEY"]) == 2
    assert "MCPRL_TEST_NO_SUCH_KEY: the environment variable is not set" in capsys.readouterr().err
