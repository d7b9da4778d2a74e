"""Tool-call parsers per model family, and recognising a model's family from its chat template."""

from mcprl_env.parsing.base import ParsedTurn, ToolCall, ToolCallParser, ToolSchemas
from mcprl_env.parsing.detect import (
    PROBE_CALL,
    PROBE_TOOL,
    detect_parser_family,
    render_assistant_turn,
    render_probe_turn,
    resolve_parser,
)
from mcprl_env.parsing.hermes import HermesToolCallParser
from mcprl_env.parsing.llama3 import Llama3JsonToolCallParser
from mcprl_env.parsing.qwen_xml import QwenXmlToolCallParser, convert_argument
from mcprl_env.parsing.registry import AUTO, get_parser, parser_families, register_parser

__all__ = [
    "AUTO",
    "PROBE_CALL",
    "PROBE_TOOL",
    "HermesToolCallParser",
    "Llama3JsonToolCallParser",
    "ParsedTurn",
    "QwenXmlToolCallParser",
    "ToolCall",
    "ToolCallParser",
    "ToolSchemas",
    "convert_argument",
    "detect_parser_family",
    "get_parser",
    "parser_families",
    "register_parser",
    "render_assistant_turn",
    "render_probe_turn",
    "resolve_parser",
]
