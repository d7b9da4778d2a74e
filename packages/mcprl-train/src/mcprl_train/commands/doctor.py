"""``mcprl-train doctor``: is this machine and this config ready to train? One row per check, a fix per failure.

Checks, in order:

1. installation — every mcprl package imports; the extras the config needs are installed (DeepSpeed for
   ``distributed.backend=deepspeed``, bitsandbytes for ``quantization=nf4``, peft for LoRA, vLLM for the vLLM
   sampler, wandb/weave for tracking);
2. devices — the configured device exists (CUDA device count for ``distributed.num_gpus``, MPS);
3. API keys — every ``${VAR}`` the tools config references is set (and ``WANDB_API_KEY`` when weave is on);
4. MCP servers — each configured server starts on its own and lists its tools (per-server deadline);
5. task data — the train and validation files parse against the task schema, and every server a task names
   is configured.

Nothing here changes state; servers are started and stopped again.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import re
import tomllib
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import anyio
import attrs
import yaml
from rich.table import Table

from mcprl_train import build
from mcprl_train.config import Config, InlineServers, OfflineServers, ServersFile

__all__ = ["CheckResult", "render_report", "run_checks"]

_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-[^}]*)?\}")
_PACKAGES = ("mcprl_grpo", "mcprl_tools", "mcprl_env", "mcprl_policy", "mcprl_servers", "mcprl_tasks")


@attrs.frozen(kw_only=True)
class CheckResult:
    """One line of the report.

    Attributes:
        category: installation, devices, keys, servers or tasks.
        name: What was checked.
        ok: Whether it passed.
        detail: What was found.
        fix: What to do about a failure (empty when ok).
    """

    category: str
    name: str
    ok: bool
    detail: str
    fix: str = ""


def run_checks(config: Config, *, servers: bool = True, server_timeout: float = 60.0) -> list[CheckResult]:
    """Run every check for ``config``; ``servers=False`` skips starting the MCP servers."""
    results = [*_installation(config), *_devices(config)]
    raw, source_error = _raw_servers(config)
    if source_error is not None:
        results.append(source_error)
    results.extend(_keys(config, raw))
    if servers and raw is not None:
        results.extend(anyio.run(_servers, raw, server_timeout))
    results.extend(_tasks(config, set(raw or {})))
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
    for module in _PACKAGES:
        version = _version(module)
        yield CheckResult(
            category="installation",
            name=module,
            ok=version is not None,
            detail=version or "not importable",
            fix="" if version else f"uv sync (or pip install {module.replace('_', '-')})",
        )
    needed: list[tuple[str, str, str]] = []
    if config.distributed.backend == "deepspeed":
        needed.append(("deepspeed", "distributed.backend=deepspeed", "pip install 'mcprl-train[deepspeed]'"))
    if config.quantization is not None:
        needed.append(
            ("bitsandbytes", f"quantization={config.quantization}", "pip install 'mcprl-train[qlora]'")
        )
    if config.lora is not None:
        needed.append(("peft", "lora", "pip install peft"))
    if config.sampler.backend == "vllm":
        needed.append(("vllm", "sampler.backend=vllm", "pip install 'mcprl-train[vllm]' (needs a CUDA GPU)"))
    if config.tracking.wandb in ("online", "offline"):
        needed.append(
            ("wandb", f"tracking.wandb={config.tracking.wandb}", "pip install 'mcprl-train[tracking]'")
        )
    if config.tracking.weave:
        needed.append(("weave", "tracking.weave", "pip install 'mcprl-train[tracking]'"))
    for module, reason, fix in needed:
        version = _version(module)
        yield CheckResult(
            category="installation",
            name=f"{module} (for {reason})",
            ok=version is not None,
            detail=version or "not installed",
            fix="" if version else fix,
        )


def _devices(config: Config) -> Iterator[CheckResult]:
    import torch

    device = config.model.device.partition(":")[0]
    cuda = torch.cuda.device_count() if torch.cuda.is_available() else 0
    mps = bool(torch.backends.mps.is_available())
    found = f"cuda devices: {cuda}, mps: {'yes' if mps else 'no'}, cpu threads: {torch.get_num_threads()}"
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


def _raw_servers(config: Config) -> tuple[dict[str, Any] | None, CheckResult | None]:
    """The ``mcpServers`` mapping before ``${VAR}`` expansion (so missing keys can be reported by name)."""
    match config.tools.source:
        case InlineServers(servers=inline):
            return dict(inline), None
        case OfflineServers(names=names):
            from mcprl_servers.config import default_servers_config

            servers: Any = default_servers_config(list(names))["mcpServers"]
            return dict(servers), None
        case ServersFile(path=file):
            path = Path(file)
            try:
                text = path.read_text(encoding="utf-8")
                match path.suffix.lower():
                    case ".yaml" | ".yml":
                        data = yaml.safe_load(text)
                    case ".toml":
                        data = tomllib.loads(text)
                    case _:
                        data = json.loads(text)
                return dict(data["mcpServers"]), None
            except (OSError, ValueError, KeyError, TypeError, yaml.YAMLError) as exc:
                return None, CheckResult(
                    category="servers",
                    name=f"tools.servers={path}",
                    ok=False,
                    detail=f"cannot read an mcpServers mapping: {exc}",
                    fix='write a JSON/YAML/TOML file {"mcpServers": {name: {"command": ..., "args": [...]}}}',
                )


def _referenced_vars(value: object) -> set[str]:
    match value:
        case str():
            return set(_VAR.findall(value))
        case Mapping():
            return set().union(*(_referenced_vars(v) for v in value.values())) if value else set()
        case list() | tuple():
            return set().union(*(_referenced_vars(v) for v in value)) if value else set()
        case _:
            return set()


def _keys(config: Config, raw: Mapping[str, Any] | None) -> Iterator[CheckResult]:
    for name, spec in (raw or {}).items():
        for var in sorted(_referenced_vars(spec)):
            present = bool(os.environ.get(var))
            yield CheckResult(
                category="keys",
                name=f"${{{var}}} (server {name})",
                ok=present,
                detail="set" if present else "not set",
                fix="" if present else f"export {var}=... (it is passed only to server {name!r})",
            )
    if config.tracking.weave:
        present = (
            bool(os.environ.get("WANDB_API_KEY")) or os.environ.get("WEAVE_DISABLED", "").lower() == "true"
        )
        yield CheckResult(
            category="keys",
            name="WANDB_API_KEY (tracking.weave)",
            ok=present,
            detail="set" if present else "not set",
            fix="" if present else "export WANDB_API_KEY=... or --set tracking.weave=false",
        )


async def _servers(raw: Mapping[str, Any], deadline_s: float) -> list[CheckResult]:
    results: dict[str, CheckResult] = {}

    async def check(name: str, spec: Any) -> None:
        results[name] = await _check_server(name, spec, deadline_s)

    async with anyio.create_task_group() as group:
        for name, spec in raw.items():
            group.start_soon(check, name, spec)
    return [results[name] for name in raw]


async def _check_server(name: str, spec: Any, deadline_s: float) -> CheckResult:
    from mcprl_tools import MissingVariableError, ServersConfig, ToolManager, ToolsError

    try:
        cfg = ServersConfig.from_dict({"mcpServers": {name: spec}}, source=f"<server {name}>")
    except MissingVariableError as exc:
        fix = "set the environment variables it references (see the keys rows)"
        return CheckResult(category="servers", name=name, ok=False, detail=f"not started: {exc}", fix=fix)
    except ToolsError as exc:
        fix = "fix the server entry (keys: command, args, env, url...)"
        return CheckResult(category="servers", name=name, ok=False, detail=f"invalid entry: {exc}", fix=fix)
    try:
        with anyio.fail_after(deadline_s):
            async with ToolManager(cfg) as manager:
                tools = sorted(t.name for t in manager.tools)
    except TimeoutError:
        return CheckResult(
            category="servers",
            name=name,
            ok=False,
            detail=f"no answer within {deadline_s:.0f} s",
            fix="run the server command by hand and check it speaks MCP on stdio",
        )
    except (ToolsError, OSError) as exc:
        command = spec.get("command") if isinstance(spec, Mapping) else None
        return CheckResult(
            category="servers",
            name=name,
            ok=False,
            detail=f"did not start: {exc}",
            fix=f"check that {command!r} is installed and on PATH" if command else "check the server's url",
        )
    return CheckResult(
        category="servers",
        name=name,
        ok=True,
        detail=f"{len(tools)} tools: {', '.join(tools)}" if tools else "0 tools",
    )


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
            for task in iter_tasks(path):
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
