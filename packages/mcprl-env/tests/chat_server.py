"""A real HTTP server on a local port that speaks the OpenAI chat-completions API, for the judge's tests.

It is the one test double of the judge tests: hosted APIs are unreachable here and a vLLM server needs a GPU.
The judge talks to it over real sockets exactly as to ``vllm serve``. Its grading rule reads the rendered
`mcprl_env.judge.DEFAULT_RUBRIC`: correct when the reference answer occurs in the assistant's answer. Tests
queue replies that override the rule (an HTTP status, a malformed content) and set a per-request delay; the
server records every request and the most requests it ever had in flight at once.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

_REFERENCE = re.compile(r"Reference answer \(may be empty\): (.*)")
_ANSWER = re.compile(r"Assistant's final answer:\n(.*)", re.DOTALL)


class ChatServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.requests: list[dict[str, Any]] = []
        self.headers_seen: list[dict[str, str]] = []
        self.replies: list[
            tuple[int, str | None]
        ] = []  # (status, content or None for the rule), consumed in order
        self.delay_s = 0.0
        self.in_flight = 0
        self.max_in_flight = 0
        self.lock = threading.Lock()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/v1"

    def grade(self, body: dict[str, Any]) -> str:
        user = body["messages"][-1]["content"]
        reference, answer = _REFERENCE.search(user), _ANSWER.search(user)
        correct = bool(reference and answer and reference.group(1).strip() in answer.group(1))
        return json.dumps({"correct": correct, "reason": "matches the reference" if correct else "differs"})


class _Handler(BaseHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        del format, args

    def do_POST(self) -> None:
        srv = self.server
        assert isinstance(srv, ChatServer)
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        with srv.lock:
            srv.requests.append(body)
            srv.headers_seen.append(dict(self.headers))
            srv.in_flight += 1
            srv.max_in_flight = max(srv.max_in_flight, srv.in_flight)
            status, content = srv.replies.pop(0) if srv.replies else (200, None)
        try:
            time.sleep(srv.delay_s)
            if self.path != "/v1/chat/completions":
                status, content = 404, None
            if status != 200:
                payload = json.dumps({"error": {"message": f"scripted {status}"}}).encode()
            else:
                text = srv.grade(body) if content is None else content
                payload = json.dumps(
                    {
                        "id": "chatcmpl-test",
                        "object": "chat.completion",
                        "model": body["model"],
                        "choices": [
                            {
                                "index": 0,
                                "message": {"role": "assistant", "content": text},
                                "finish_reason": "stop",
                            }
                        ],
                        "usage": {
                            "prompt_tokens": sum(len(m["content"].split()) for m in body["messages"]),
                            "completion_tokens": len(text.split()),
                        },
                    }
                ).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up (a timeout test)
        finally:
            with srv.lock:
                srv.in_flight -= 1


@contextmanager
def chat_server() -> Iterator[ChatServer]:
    """A `ChatServer` serving on a thread for the duration of the block."""
    server = ChatServer()
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
