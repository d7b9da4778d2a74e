"""`ToolAccess`: the tools one task may use, as rendered into its prompt and as names a call may use."""

from __future__ import annotations

from typing import Any

import attrs

from mcprl_env.protocols import ToolCaller
from mcprl_env.tasks import Task

__all__ = ["ToolAccess"]


@attrs.frozen(kw_only=True)
class ToolAccess:
    """The tools one task may use.

    Attributes:
        schemas: Chat-template schemas rendered into the prompt.
        callable_names: Names a call may use (exposed names and ``server.tool`` forms).
    """

    schemas: tuple[dict[str, Any], ...]
    callable_names: frozenset[str]

    @classmethod
    def for_task(cls, manager: ToolCaller, task: Task) -> ToolAccess:
        """Tools of ``task.servers`` (all servers when None), filtered by ``task.tools``."""
        servers = set(task.servers) if task.servers is not None else None
        allowed: set[str] = set()
        names: set[str] = set()
        for spec in manager.tools:
            if servers is not None and spec.server not in servers:
                continue
            qualified = f"{spec.server}.{spec.tool}"
            if task.tools is None or spec.name in task.tools or qualified in task.tools:
                allowed.add(spec.name)
                names.update((spec.name, qualified))
        if task.tools is not None:
            missing = sorted(set(task.tools) - names)
            if missing:
                raise ValueError(f"task {task.id!r} allows tools that no server offers: {missing}")
        schemas = manager.tool_schemas(list(task.servers) if task.servers is not None else None)
        kept = tuple(s for s in schemas if s.get("function", {}).get("name") in allowed)
        return cls(schemas=kept, callable_names=frozenset(names))
