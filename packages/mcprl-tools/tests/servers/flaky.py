"""A stdio MCP test server that misbehaves on demand.

Flags: `--exit-before-init` (exit 3 before reading anything), `--junk-at-start` (print non-JSON lines on
stdout before serving), `--ignore-sigterm`, `--tools-variant N` (changes a description: catalogue drift),
`--variant-file PATH` (read the variant from a file at every listing, for mid-run catalogue changes).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from pathlib import Path

parser = argparse.ArgumentParser()
parser.add_argument("--exit-before-init", action="store_true")
parser.add_argument("--junk-at-start", action="store_true")
parser.add_argument("--ignore-sigterm", action="store_true")
parser.add_argument("--variant-file", default=None)
parser.add_argument("--http-port", type=int, default=None)
opts = parser.parse_args()

if opts.exit_before_init:
    print("flaky: exiting before initialize on purpose", file=sys.stderr, flush=True)
    sys.exit(3)
if opts.ignore_sigterm:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
if opts.junk_at_start:
    sys.stdout.write("this is not json\n{broken\n")
    sys.stdout.flush()

import anyio  # noqa: E402
from mcp.server.mcpserver import Context, MCPServer  # noqa: E402
from mcp.server.mcpserver.exceptions import ToolError  # noqa: E402

variant = Path(opts.variant_file).read_text().strip() if opts.variant_file else "0"
server = MCPServer("flaky")


@server.tool(description=f"Echo the text back (variant {variant}).")
def echo(text: str) -> str:
    return text


@server.tool(description="Add two integers.")
def add(a: int, b: int) -> int:
    return a + b


_inflight = 0
_inflight_max = 0


@server.tool(description="Sleep without blocking, counting concurrent calls; returns the text.")
async def nap(seconds: float, text: str = "") -> str:
    global _inflight, _inflight_max
    _inflight += 1
    _inflight_max = max(_inflight_max, _inflight)
    try:
        await anyio.sleep(seconds)
    finally:
        _inflight -= 1
    return text


@server.tool(description="Most calls seen in flight at once by this process.")
def max_inflight() -> int:
    return _inflight_max


@server.tool(description="Return the process id of the server.")
def pid() -> int:
    return os.getpid()


@server.tool(description="Start a long-lived child process (it inherits the environment) and return its pid.")
def spawn_child() -> int:
    import subprocess

    child = subprocess.Popen(["sleep", "300"], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
    return child.pid


@server.tool(description="Kill this server with SIGKILL while the call is in flight.")
def crash() -> str:
    os.kill(os.getpid(), signal.SIGKILL)
    return "unreachable"


@server.tool(description="Block the server's event loop for a long time (a hang).")
async def hang(seconds: float = 3600.0) -> str:
    time.sleep(seconds)  # noqa: ASYNC251 - blocking on purpose: the whole server stops answering
    return "woke up"


@server.tool(description="Return n bytes of output.")
def big(n: int) -> str:
    return "x" * n


@server.tool(description="Write n bytes to stderr, then answer.")
def shout(n: int) -> str:
    sys.stderr.write("e" * n)
    sys.stderr.flush()
    return "said"


@server.tool(description="Raise a tool error.")
def fail(message: str) -> str:
    raise ToolError(message)


@server.tool(description="Return the episode id from the request _meta.")
def whoami(ctx: Context) -> str:
    meta = ctx.request_context.meta or {}
    return str(meta.get("mcprl/episode_id", "default"))


@server.tool(description="Print junk on stdout, then answer.")
def junk() -> str:
    sys.stdout.write("junk line in the middle of the stream\n")
    sys.stdout.flush()
    return "still fine"


@server.tool(description="Return the value of an environment variable (secrets isolation test).")
def getenv(name: str) -> str:
    return os.environ.get(name, "<unset>")


if __name__ == "__main__":
    if opts.http_port is not None:
        server.run("streamable-http", host="127.0.0.1", port=opts.http_port)
    else:
        server.run()
