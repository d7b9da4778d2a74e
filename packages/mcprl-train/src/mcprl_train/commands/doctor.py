"""``mcprl-train doctor``: is this machine and this config ready to train? One row per check, a fix per failure.

Checks, in order: installation (every mcprl package imports; the extras the config needs are installed),
devices (the configured device exists, CUDA devices for ``distributed.num_gpus``), API keys (every ``${VAR}``
a configured server references, ``WANDB_API_KEY`` when weave is on), MCP servers (the servers
`mcprl_train.build.servers_config` gives load, and each starts on its own and lists its tools within a
deadline), task data (the train and validation files parse against the task schema, every server a task
names is configured), and the model (`mcprl_train.model_checks`, the checks ``train`` runs at start: tokenizer
and chat template, no weights). Nothing here changes state; servers are started and stopped again.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
from collections.abc import Iterator
from typing import TYPE_CHECKING

import anyio
import attrs
from rich.table import Table

from mcprl_train import build
from mcprl_train.config import Config, InlineServers, OfflineServers, ServersFile
from mcprl_train.cpu_threads import ThreadLoad
from mcprl_train.model_checks import CheckResult, check_model
from mcprl_train.run.tracking import weave_disabled

if TYPE_CHECKING:
    from mcprl_tools import ServerConfig, ServersConfig

__all__ = ["CheckResult", "render_report", "run_checks"]

_PACKAGES = ("mcprl_grpo", "mcprl_tools", "mcprl_env", "mcprl_policy", "mcprl_servers", "mcprl_tasks")


def run_checks(config: Config, *, servers: bool = True, server_timeout: float = 60.0) -> list[CheckResult]:
    """Run every check for ``config``; ``servers=False`` skips starting the MCP servers."""
    results = [*_installation(config), *_devices(config)]
    tools = _load_servers(config)
    if isinstance(tools, CheckResult):
        results.append(tools)
        tools = None
    results.extend(_keys(config, tools))
    if servers and tools is not None:
        results.extend(anyio.run(_servers, tools, server_timeout))
    results.extend(_tasks(config, set(tools.servers) if tools is not None else set()))
    results.extend(check_model(config))
    return results


def render_report(results: list[CheckResult]) -> Table:
    """The results as a rich table (failures in red with their fix)."""
    failed = sum(not r.ok for r in results)
    title = "mcprl-train doctor: " + ("all checks passed" if not failed else f"{failed} check(s) failed")
    table = Table(title=title, show_lines=False)
    for column in ("check", "", "detail", "fix"):
        table.add_column(column, overflow="fold")
    for r in results:
        mark = "[green]ok[/green]" if r.ok else "[red]FAIL[/red]"
        table.add_row(f"{r.category}: {r.name}", mark, r.detail, r.fix)
    return table


# -- installation and devices -----------------------------------------------------------------------------------


def _version(module: str) -> str | None:
    if importlib.util.find_spec(module) is None:
        return None
    try:
        return importlib.metadata.version(module.replace("_", "-"))
    except importlib.metadata.PackageNotFoundError:
        return "installed"


def _installation(config: Config) -> Iterator[CheckResult]:
    wanted = [(m, m, "not importable", f"uv sync (or pip install {m.replace('_', '-')})") for m in _PACKAGES]
    extras: list[tuple[str, str, str]] = []
    if config.distributed.backend == "deepspeed":
        extras.append(("deepspeed", "distributed.backend=deepspeed", "pip install 'mcprl-train[deepspeed]'"))
    if config.quantization is not None:
        extras.append(
            ("bitsandbytes", f"quantization={config.quantization}", "pip install 'mcprl-train[qlora]'")
        )
    if config.lora is not None:
        extras.append(("peft", "lora", "pip install peft"))
    if config.sampler.backend == "vllm":
        extras.append(("vllm", "sampler.backend=vllm", "pip install 'mcprl-train[vllm]' (needs a CUDA GPU)"))
    if config.tracking.wandb in ("online", "offline"):
        extras.append(
            ("wandb", f"tracking.wandb={config.tracking.wandb}", "pip install 'mcprl-train[tracking]'")
        )
    if config.tracking.weave:
        extras.append(("weave", "tracking.weave", "pip install 'mcprl-train[tracking]'"))
    wanted += [(f"{m} (for {reason})", m, "not installed", fix) for m, reason, fix in extras]
    for name, module, missing, fix in wanted:
        version = _version(module)
        yield CheckResult(
            category="installation",
            name=name,
            ok=version is not None,
            detail=version or missing,
            fix="" if version else fix,
        )


def _devices(config: Config) -> Iterator[CheckResult]:
    import torch

    device = config.model.device.partition(":")[0]
    cuda = torch.cuda.device_count() if torch.cuda.is_available() else 0
    mps = bool(torch.backends.mps.is_available())
    found = f"cuda devices: {cuda}, mps: {'yes' if mps else 'no'}, cpu: {ThreadLoad.measure().describe()}"
    match device:
        case "cuda":
            need = config.distributed.num_gpus if config.distributed.backend == "deepspeed" else 1
            ok = cuda >= need
            fix = "" if ok else f"needs {need} CUDA device(s); run on a GPU machine or use --profile cpu"
        case "mps":
            ok = mps
            fix = "" if ok else "MPS needs Apple silicon with a recent macOS; use --profile cpu"
        case _:
            ok, fix = True, ""
    yield CheckResult(
        category="devices", name=f"model.device={config.model.device}", ok=ok, detail=found, fix=fix
    )


# -- keys and servers -------------------------------------------------------------------------------------------


def _load_servers(config: Config) -> ServersConfig | CheckResult:
    """The servers `build.servers_config` gives, unset `${VAR}`s kept as written (the keys rows name them)."""
    try:
        return build.servers_config(config, missing_variables="keep")
    except ValueError as exc:  # mcprl_tools.ConfigError (file, server, key), tools.allow_tools, offline names
        match config.tools.source:
            case ServersFile(path=path):
                name = f"tools.servers={path}"
            case InlineServers():
                name = "tools.mcp_servers"
            case OfflineServers(names=names):
                name = f"tools.offline={list(names)}"
        return CheckResult(
            category="servers",
            name=name,
            ok=False,
            detail=f"cannot load the servers: {exc}",
            fix='fix what the error names; the format is {"mcpServers": {name: {"command": ..., "args": [...]}}}',
        )


def _keys(config: Config, tools: ServersConfig | None) -> Iterator[CheckResult]:
    for server in tools.servers.values() if tools is not None else ():
        for var in sorted(server.variables):
            present = bool(os.environ.get(var))
            yield CheckResult(
                category="keys",
                name=f"${{{var}}} (server {server.name})",
                ok=present,
                detail="set" if present else "not set",
                fix="" if present else f"export {var}=... (it is passed only to server {server.name!r})",
            )
    if config.tracking.weave:
        present = bool(os.environ.get("WANDB_API_KEY")) or weave_disabled(os.environ)
        yield CheckResult(
            category="keys",
            name="WANDB_API_KEY (tracking.weave)",
            ok=present,
            detail="set" if present else "not set",
            fix="" if present else "export WANDB_API_KEY=... or --set tracking.weave=false",
        )


async def _servers(tools: ServersConfig, deadline_s: float) -> list[CheckResult]:
    results: dict[str, CheckResult] = {}

    async def check(server: ServerConfig) -> None:
        alone = attrs.evolve(tools, servers={server.name: server})
        results[server.name] = await _check_server(server, alone, deadline_s)

    async with anyio.create_task_group() as group:
        for server in tools.servers.values():
            group.start_soon(check, server)
    return [results[name] for name in tools.servers]


async def _check_server(server: ServerConfig, alone: ServersConfig, deadline_s: float) -> CheckResult:
    from mcprl_tools import ToolManager, ToolsError

    def row(detail: str, fix: str = "", *, ok: bool = False) -> CheckResult:
        return CheckResult(category="servers", name=server.name, ok=ok, detail=detail, fix=fix)

    unset = [f"${{{var}}}" for var in sorted(server.variables) if var not in os.environ]
    if unset:
        return row(
            f"not started: {', '.join(unset)} not set",
            "set the environment variables it references (see the keys rows)",
        )
    try:
        with anyio.fail_after(deadline_s):
            async with ToolManager(alone) as manager:
                tools = sorted(t.name for t in manager.tools)
    except TimeoutError:
        return row(
            f"no answer within {deadline_s:.0f} s",
            "run the server command by hand and check it speaks MCP on stdio",
        )
    except (ToolsError, OSError) as exc:
        fix = f"check that {server.command!r} is installed and on PATH" if server.command else "check its url"
        return row(f"did not start: {exc}", server.redact(fix))
    return row(f"{len(tools)} tools: {', '.join(tools)}" if tools else "0 tools", ok=True)


# -- tasks ------------------------------------------------------------------------------------------------------


def _tasks(config: Config, configured: set[str]) -> Iterator[CheckResult]:
    from mcprl_env.errors import TaskValidationError
    from mcprl_env.loaders import iter_tasks
    from mcprl_tasks.errors import TasksError

    specs = [("train", config.tasks.train)]
    if config.tasks.validation is not None:
        specs.append(("validation", config.tasks.validation))
    for split, spec in specs:
        try:
            path = build.task_path(spec, name=split)
            count = 0
            named: set[str] = set()
            for task in iter_tasks(path, default_checker=build.default_checker(config)):
                count += 1
                named.update(task.servers or ())
        except (TaskValidationError, TasksError, OSError, ValueError) as exc:
            yield CheckResult(
                category="tasks",
                name=f"tasks.{split}={spec}",
                ok=False,
                detail=str(exc),
                fix="fix the task at that line (schema: docs/INTERFACES.md, 'Tasks')",
            )
            continue
        missing = sorted(named - configured) if configured else []
        ok = count > 0 and not missing
        detail = f"{count} tasks" + (f"; servers not configured: {', '.join(missing)}" if missing else "")
        fix = ""
        if count == 0:
            fix = "the file holds no task"
        elif missing:
            fix = f"add {', '.join(missing)} to the tools config (or --set tools.offline=[...])"
        yield CheckResult(category="tasks", name=f"tasks.{split}={spec}", ok=ok, detail=detail, fix=fix)
