"""Offline MCP servers: calculator, finance, search, python sandbox, messaging."""

__all__: list[str] = []
