"""The embedded text the tiny model's tokenizer is trained on.

Chat scaffolding, tool-call JSON, the demo servers' tool names and arguments, numbers and finance words:
enough for byte-level BPE to learn merges for the strings the tiny model reads and writes. Digits are never
merged (the tokenizer splits them individually) so the model can copy prices digit by digit.
"""

from __future__ import annotations

from collections.abc import Iterator

__all__ = ["embedded_corpus"]

_TOOLS: dict[str, tuple[str, ...]] = {
    "calculate": ("expression",),
    "get_quote": ("symbol",),
    "get_history": ("symbol", "start", "end"),
    "get_profile": ("symbol",),
    "search_symbols": ("query",),
    "get_financials": ("symbol", "statement"),
    "search": ("query", "k"),
    "fetch_document": ("doc_id",),
    "run_python": ("code",),
    "list_channels": (),
    "list_users": (),
    "post_message": ("channel", "text"),
    "read_messages": ("channel", "limit"),
    "search_messages": ("query",),
}

_WORDS = (
    "price quote stock share shares symbol company market cap revenue income net profit margin earnings "
    "dividend yield volume open close high low change percent ratio growth total average sum difference "
    "product times plus minus divided multiply add subtract compute calculate answer result value report "
    "balance sheet cash flow statement annual quarterly fiscal year date start end history profile sector "
    "industry employees ceo headquarters exchange currency usd dollars cents million billion thousand "
    "search document fetch query results title snippet channel message post read user users general "
    "random engineering finance team please what is the of a an and or in on at to for from by with "
    "how many much which who when where why does do did was were be been has have had this that these "
    "those it its than then there their them they you your we our i me my he she his her not no yes "
    "true false null error tool call response function arguments name description parameters required "
    "type string number integer object array properties think answer final first second third last next"
)

_SYMBOLS = ("ACME", "GLOBEX", "INITECH", "UMBRELLA", "HOOLI", "STARK", "WAYNE", "WONKA", "TYRELL", "CYBER")


def _tool_lines() -> Iterator[str]:
    for name, args in _TOOLS.items():
        yield f"{name}({', '.join(args)}): {name.replace('_', ' ')}"
        arguments = ", ".join(f'"{a}": "{_SYMBOLS[i % len(_SYMBOLS)]}"' for i, a in enumerate(args))
        yield f'<tool_call>{{"name": "{name}", "arguments": {{{arguments}}}}}</tool_call>'


def _numbers() -> Iterator[str]:
    for i, symbol in enumerate(_SYMBOLS):
        price = f"{(i * 37.31 + 12.5) % 500:.2f}"
        yield f'{{"symbol":"{symbol}","price":{price},"currency":"USD","change":-{i}.{i}{i}}}'
        yield f"What is {i + 2} times the price of {symbol}? <answer>{price}</answer>"
        yield f'<tool_response>\n{{"result": "{price}"}}\n</tool_response>'


def embedded_corpus() -> list[str]:
    """The embedded training text for the tiny tokenizer, one document per item (deterministic)."""
    scaffold = [
        "<|im_start|>system\nYou are a helpful assistant.\n\n# Tools\n<|im_end|>\n",
        "<|im_start|>user\nWhat is the price of ACME?<|im_end|>\n<|im_start|>assistant\n",
        "<think>I need to call a tool first.</think>",
        'Call tools as <tool_call>{"name": ..., "arguments": {...}}</tool_call>. '
        "Give the final answer as <answer>...</answer>.",
    ]
    words = _WORDS.split()
    sentences = [" ".join(words[i : i + 12]) for i in range(0, len(words), 12)]
    capitalised = [" ".join(w.capitalize() for w in words[i : i + 12]) for i in range(0, len(words), 12)]
    return [*scaffold, *_tool_lines(), *_numbers(), *sentences, *capitalised, *_SYMBOLS]
