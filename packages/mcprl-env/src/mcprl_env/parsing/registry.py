"""Parsers by model family: the registry behind ``EnvConfig.parser`` and `get_parser`.

Built-in families (aliases in brackets):

- ``hermes`` [``qwen``, ``qwen2``, ``qwen2.5``, ``qwen3``]: `HermesToolCallParser` (Hermes 2/3, Qwen2.5, Qwen3,
  QwQ, and mcprl's own tiny model).
- ``qwen3_coder`` [``qwen3.5``, ``qwen3-coder``, ``qwen3_xml``]: `QwenXmlToolCallParser` (Qwen3.5, Qwen3-Coder).
- ``llama3_json`` [``llama3``, ``llama3.1``, ``llama3.2``, ``llama3.3``]: `Llama3JsonToolCallParser`.

``"auto"`` is not a family: it asks `mcprl_env.resolve_parser` to recognise the family from what the chat
template renders (`mcprl_env.detect_parser_family`).
"""

from __future__ import annotations

from collections.abc import Callable

from mcprl_env.parsing.base import ToolCallParser
from mcprl_env.parsing.hermes import HermesToolCallParser
from mcprl_env.parsing.llama3 import Llama3JsonToolCallParser
from mcprl_env.parsing.qwen_xml import QwenXmlToolCallParser

__all__ = ["AUTO", "canonical_families", "get_parser", "parser_families", "register_parser"]

AUTO = "auto"
"""The ``EnvConfig.parser`` value that recognises the family from the chat template."""

ParserFactory = Callable[[], ToolCallParser]

_REGISTRY: dict[str, ParserFactory] = {
    "hermes": HermesToolCallParser,
    "qwen": HermesToolCallParser,
    "qwen2": HermesToolCallParser,
    "qwen2.5": HermesToolCallParser,
    "qwen3": HermesToolCallParser,
    "qwen3_coder": QwenXmlToolCallParser,
    "qwen3.5": QwenXmlToolCallParser,
    "qwen3-coder": QwenXmlToolCallParser,
    "qwen3_xml": QwenXmlToolCallParser,
    "llama3_json": Llama3JsonToolCallParser,
    "llama3": Llama3JsonToolCallParser,
    "llama3.1": Llama3JsonToolCallParser,
    "llama3.2": Llama3JsonToolCallParser,
    "llama3.3": Llama3JsonToolCallParser,
}


def register_parser(family: str, factory: ParserFactory) -> None:
    """Register (or replace) the parser used for a model family; it takes part in auto-detection too.

    Raises:
        ValueError: ``family`` is ``"auto"``.
    """
    if family.lower() == AUTO:
        raise ValueError(f"{AUTO!r} selects auto-detection; it cannot name a parser")
    _REGISTRY[family.lower()] = factory


def parser_families() -> list[str]:
    """Model families (and aliases) with a registered parser."""
    return sorted(_REGISTRY)


def canonical_families() -> list[tuple[str, ParserFactory]]:
    """One ``(family, factory)`` per distinct parser, first-registered name, in registration order."""
    seen: dict[int, tuple[str, ParserFactory]] = {}
    for name, factory in _REGISTRY.items():
        seen.setdefault(id(factory), (name, factory))
    return list(seen.values())


def get_parser(family: str) -> ToolCallParser:
    """A new parser for ``family`` (e.g. ``"hermes"``, ``"qwen3.5"``, ``"llama3"``).

    Raises:
        KeyError: No parser is registered for ``family``; the message lists the known families.
    """
    try:
        factory = _REGISTRY[family.lower()]
    except KeyError:
        hint = (
            f" ({AUTO!r} needs the tokenizer: use mcprl_env.resolve_parser)" if family.lower() == AUTO else ""
        )
        raise KeyError(
            f"no tool-call parser for model family {family!r}{hint}; known: {parser_families()}"
        ) from None
    return factory()
