"""`mcprl-tools`: list servers and tools, or call one tool, for people debugging MCP servers.

```
mcprl-tools list --config servers.json [--json]
mcprl-tools call --config servers.json server.tool '{"a": 1}' [--episode-id ep-1]
```
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

import anyio
import structlog

from mcprl_tools.config import ServersConfig
from mcprl_tools.errors import ToolsError
from mcprl_tools.manager import ToolManager


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mcprl-tools", description=__doc__.split("\n")[0] if __doc__ else None
    )
    sub = parser.add_subparsers(dest="command", required=True)
    lister = sub.add_parser("list", help="start every server and print its tools and schemas")
    lister.add_argument("--config", required=True, help="servers file (JSON, YAML or TOML with mcpServers)")
    lister.add_argument("--json", action="store_true", help="print the function-tool schemas as JSON")
    caller = sub.add_parser("call", help="call one tool and print the result")
    caller.add_argument("--config", required=True)
    caller.add_argument("tool", help="tool name or server.tool")
    caller.add_argument("arguments", nargs="?", default="{}", help="JSON object of arguments")
    caller.add_argument("--episode-id", default=None)
    return parser


async def _list(cfg: ServersConfig, as_json: bool) -> int:
    async with ToolManager(cfg) as manager:
        if as_json:
            print(json.dumps(manager.tool_schemas(), indent=2, ensure_ascii=False))
            return 0
        for server in cfg.servers:
            specs = [t for t in manager.tools if t.server == server]
            print(f"{server}  [{manager.server_state(server)}]  {len(specs)} tools")
            for spec in specs:
                print(f"  {spec.name}: {spec.description.splitlines()[0] if spec.description else ''}")
                print(f"    parameters: {json.dumps(spec.input_schema, ensure_ascii=False)}")
    return 0


async def _call(cfg: ServersConfig, tool: str, arguments: Any, episode_id: str | None) -> int:
    async with ToolManager(cfg) as manager:
        result = await manager.call(tool, arguments, episode_id=episode_id)
    print(json.dumps(result.to_json(), indent=2, ensure_ascii=False, default=repr))
    return 0 if result.ok else 1


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `mcprl-tools` command.

    Returns:
        0 on success, 1 when the tool call failed, 2 on usage or configuration errors.
    """
    args = _parser().parse_args(argv)
    # An application entry point, so it may configure logging: keep stdout for results only.
    structlog.configure(logger_factory=lambda *_: structlog.PrintLogger(file=sys.stderr))
    try:
        cfg = ServersConfig.load(args.config)
        match args.command:
            case "list":
                return anyio.run(_list, cfg, args.json)
            case "call":
                try:
                    arguments = json.loads(args.arguments)
                except ValueError as exc:
                    print(f"mcprl-tools: arguments are not valid JSON: {exc}", file=sys.stderr)
                    return 2
                return anyio.run(_call, cfg, args.tool, arguments, args.episode_id)
            case _:
                raise AssertionError(args.command)
    except ToolsError as exc:
        print(f"mcprl-tools: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
