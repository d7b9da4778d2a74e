"""Calculator MCP server: ``calculate(expression)`` with exact arithmetic and a safe parser.

Run it with ``python -m mcprl_servers.calculator`` (stdio) or use :func:`build_server` in process.
"""

from __future__ import annotations

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

from mcprl_servers.errors import ExpressionError
from mcprl_servers.expression import evaluate
from mcprl_servers.formatting import format_number

__all__ = ["build_server", "calculate_text", "main"]

# Kept short: tool descriptions are rendered into every prompt of the tiny demo model.
_DESCRIPTION = (
    "Evaluate an arithmetic expression exactly, e.g. '3 * 42.17'. Operators + - * / // % ** and parentheses; "
    "functions abs, min, max, round(x, n), sqrt. Result: a decimal rounded to at most 6 places."
)


def calculate_text(expression: str) -> str:
    """Evaluate ``expression`` and render it exactly as the ``calculate`` tool does.

    Raises:
        ExpressionError: The expression cannot be evaluated (the message is what the tool reports).
    """
    return format_number(evaluate(expression))


def build_server() -> MCPServer:
    """Build the calculator server (one tool: ``calculate``)."""
    server = MCPServer("calculator", instructions="Exact arithmetic on expressions.", log_level="WARNING")

    @server.tool(description=_DESCRIPTION, structured_output=False)
    def calculate(expression: str) -> str:
        try:
            return calculate_text(expression)
        except ExpressionError as exc:
            raise ToolError(str(exc)) from None

    return server


def main() -> None:
    """Serve the calculator over stdio."""
    build_server().run()


if __name__ == "__main__":
    main()
