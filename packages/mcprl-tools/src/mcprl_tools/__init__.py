"""MCP tool-server manager: launch, pool, time out, restart, call."""

__all__: list[str] = []
