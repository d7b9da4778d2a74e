"""Test doubles shipped with mcprl-env, so downstream tests need no model and no transformers.

- `CharTokenizer`: one id per character plus atomic special tokens, with a Jinja-free renderer of the
  Qwen-style chat template `QWEN_STYLE_CHAT_TEMPLATE` (tools, ``<tool_call>``, ``<tool_response>``). The same
  template string works with a transformers tokenizer and renders the same text (tested).
- `ScriptedSampler`: returns scripted assistant turns encoded with a tokenizer, with fixed logprobs.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs

__all__ = [
    "QWEN_STYLE_CHAT_TEMPLATE",
    "CharTokenizer",
    "ScriptedCompletion",
    "ScriptedSampler",
    "render_qwen_style",
]

DEFAULT_SYSTEM = "You are a helpful assistant."

QWEN_STYLE_CHAT_TEMPLATE = (
    "{%- if tools %}"
    "{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0]['role'] == 'system' %}{{- messages[0]['content'] }}"
    "{%- else %}{{- '" + DEFAULT_SYSTEM + "' }}{%- endif %}"
    '{{- "\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n'
    'You are provided with function signatures within <tools></tools> XML tags:\\n<tools>" }}'
    '{%- for tool in tools %}{{- "\\n" }}{{- tool | tojson }}{%- endfor %}'
    '{{- "\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments '
    'within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": <function-name>, '
    '\\"arguments\\": <args-json-object>}\\n</tool_call><|im_end|>\\n" }}'
    "{%- else %}"
    "{%- if messages[0]['role'] == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
    "{%- else %}{{- '<|im_start|>system\\n" + DEFAULT_SYSTEM + "<|im_end|>\\n' }}{%- endif %}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if (message.role == 'user') or (message.role == 'system' and not loop.first) %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- elif message.role == 'assistant' %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- generation %}"
    "{%- if message.content %}{{- message.content }}{%- endif %}"
    "{%- if message.tool_calls %}"
    "{%- for tool_call in message.tool_calls %}"
    "{%- if tool_call.function is defined %}{%- set tool_call = tool_call.function %}{%- endif %}"
    "{%- if message.content or not loop.first %}{{- '\\n' }}{%- endif %}"
    '{{- \'<tool_call>\\n{"name": "\' }}{{- tool_call.name }}{{- \'", "arguments": \' }}'
    "{%- if tool_call.arguments is string %}{{- tool_call.arguments }}"
    "{%- else %}{{- tool_call.arguments | tojson }}{%- endif %}"
    "{{- '}\\n</tool_call>' }}"
    "{%- endfor %}"
    "{%- endif %}"
    "{{- '<|im_end|>' }}"
    "{%- endgeneration %}"
    "{{- '\\n' }}"
    "{%- elif message.role == 'tool' %}"
    "{%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != 'tool') %}"
    "{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' }}{{- message.content }}{{- '\\n</tool_response>' }}"
    "{%- if loop.last or (messages[loop.index0 + 1].role != 'tool') %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
"""A Qwen2.5-style chat template (tools, ``<tool_call>``, ``<tool_response>``, ``{% generation %}`` markers).

Assistant turns render as ``<|im_start|>assistant\\n{content}<|im_end|>\\n``, so a sampled turn that ends with
``<|im_end|>`` is reproduced verbatim when the conversation is re-rendered.
"""


def _tojson(value: object) -> str:
    # transformers' `tojson` filter: json.dumps(ensure_ascii=False) with default separators.
    return json.dumps(value, ensure_ascii=False)


def _render_tool_calls(message: Mapping[str, Any]) -> str:
    out = ""
    content = message.get("content")
    for i, raw_call in enumerate(message.get("tool_calls") or []):
        call = raw_call.get("function", raw_call)
        if content or i > 0:
            out += "\n"
        arguments = call.get("arguments")
        args_text = arguments if isinstance(arguments, str) else _tojson(arguments)
        out += (
            '<tool_call>\n{"name": "' + str(call["name"]) + '", "arguments": ' + args_text + "}\n</tool_call>"
        )
    return out


def render_qwen_style(
    messages: Sequence[Mapping[str, Any]],
    *,
    tools: Sequence[Mapping[str, Any]] | None = None,
    add_generation_prompt: bool = False,
) -> str:
    """Render ``messages`` exactly as `QWEN_STYLE_CHAT_TEMPLATE` does, without Jinja.

    Args:
        messages: Chat messages (``role``, ``content``, optional ``tool_calls`` on assistant messages).
        tools: Tool schemas in chat-template format, or None.
        add_generation_prompt: Append the header of a new assistant turn.

    Returns:
        The rendered conversation text.
    """
    out = ""
    first_is_system = bool(messages) and messages[0].get("role") == "system"
    if tools:
        out += "<|im_start|>system\n" + (str(messages[0]["content"]) if first_is_system else DEFAULT_SYSTEM)
        out += (
            "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
            "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
        )
        for tool in tools:
            out += "\n" + _tojson(tool)
        out += (
            "\n</tools>\n\nFor each function call, return a json object with function name and arguments "
            'within <tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, '
            '"arguments": <args-json-object>}\n</tool_call><|im_end|>\n'
        )
    elif first_is_system:
        out += "<|im_start|>system\n" + str(messages[0]["content"]) + "<|im_end|>\n"
    else:
        out += "<|im_start|>system\n" + DEFAULT_SYSTEM + "<|im_end|>\n"
    for i, message in enumerate(messages):
        role = message["role"]
        if role == "user" or (role == "system" and i > 0):
            out += "<|im_start|>" + role + "\n" + str(message["content"]) + "<|im_end|>\n"
        elif role == "assistant":
            out += "<|im_start|>assistant\n" + str(message.get("content") or "")
            out += _render_tool_calls(message) + "<|im_end|>\n"
        elif role == "tool":
            if i == 0 or messages[i - 1]["role"] != "tool":
                out += "<|im_start|>user"
            out += "\n<tool_response>\n" + str(message["content"]) + "\n</tool_response>"
            if i == len(messages) - 1 or messages[i + 1]["role"] != "tool":
                out += "<|im_end|>\n"
    if add_generation_prompt:
        out += "<|im_start|>assistant\n"
    return out


class CharTokenizer:
    """A character-level tokenizer with atomic special tokens and a Qwen-style chat template.

    Ids 0..2 are ``<|endoftext|>``, ``<|im_start|>``, ``<|im_end|>``; every other character ``c`` is
    ``ord(c) + 3``. ``<|im_end|>`` is the end-of-turn (eos) id. Satisfies `mcprl_env.ChatTokenizer`.
    """

    SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")

    def __init__(self) -> None:
        self._special_ids = {tok: i for i, tok in enumerate(self.SPECIAL_TOKENS)}
        self.eos_token_id: int | None = self._special_ids["<|im_end|>"]
        self.pad_token_id: int | None = self._special_ids["<|endoftext|>"]
        self.chat_template = QWEN_STYLE_CHAT_TEMPLATE

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """Ids of ``text``: special token strings map to their ids, every other character to one id."""
        del add_special_tokens
        ids: list[int] = []
        i = 0
        offset = len(self.SPECIAL_TOKENS)
        while i < len(text):
            if text[i] == "<":
                special = next((s for s in self.SPECIAL_TOKENS if text.startswith(s, i)), None)
                if special is not None:
                    ids.append(self._special_ids[special])
                    i += len(special)
                    continue
            ids.append(ord(text[i]) + offset)
            i += 1
        return ids

    def decode(self, token_ids: Any, skip_special_tokens: bool = False) -> str:
        """Text of ``token_ids`` (ids outside the vocabulary decode to U+FFFD)."""
        offset = len(self.SPECIAL_TOKENS)
        parts: list[str] = []
        for raw in token_ids:
            tid = int(raw)
            if 0 <= tid < offset:
                if not skip_special_tokens:
                    parts.append(self.SPECIAL_TOKENS[tid])
            elif offset <= tid < 0x110000 + offset and not 0xD800 <= tid - offset <= 0xDFFF:
                parts.append(chr(tid - offset))
            else:
                parts.append("\ufffd")
        return "".join(parts)

    def apply_chat_template(
        self,
        conversation: Any,
        *,
        tools: Any = None,
        add_generation_prompt: bool = False,
        tokenize: bool = False,
        **kwargs: Any,
    ) -> Any:
        """Render with `render_qwen_style`; ids when ``tokenize=True``."""
        del kwargs
        text = render_qwen_style(conversation, tools=tools, add_generation_prompt=add_generation_prompt)
        return self.encode(text) if tokenize else text


@attrs.frozen(kw_only=True)
class ScriptedCompletion:
    """A completion returned by `ScriptedSampler` (satisfies `mcprl_env.Completion`); ``queue_s``: the wait
    before it was served that it reports (0: none)."""

    token_ids: list[int]
    logprobs: list[float]
    text: str
    finish_reason: str
    queue_s: float = 0.0


Script = Sequence[str | BaseException] | Callable[[str, int], str | BaseException]


class ScriptedSampler:
    """A sampler that answers with scripted assistant turns.

    The turn index is read from the prompt itself (the number of assistant headers in it, minus the generation
    prompt), so one sampler serves many concurrent episodes without shared state.

    Args:
        tokenizer: Encodes the scripted text (and decodes prompts for callable scripts).
        script: Either a list of turn texts (turn ``i`` gets item ``i``; past the end, the last item repeats),
            or a callable ``(prompt_text, turn_index) -> text``. An exception item is raised instead
            (simulating a broken sampler).
        logprob: Logprob reported for every sampled id.
        eos: Append the tokenizer's eos id to each turn (``finish_reason="stop"``).
        assistant_header: Text that starts an assistant turn in the rendered prompt.
    """

    def __init__(
        self,
        tokenizer: Any,
        script: Script,
        *,
        logprob: float = -1.0,
        eos: bool = True,
        assistant_header: str = "<|im_start|>assistant",
    ) -> None:
        if not callable(script) and len(script) == 0:
            raise ValueError("ScriptedSampler needs at least one scripted turn")
        self._tokenizer = tokenizer
        self._script = script
        self._logprob = logprob
        self._eos = eos
        self._header = assistant_header
        self.calls: list[tuple[list[int], int]] = []
        self.seeds: list[int | None] = []

    async def sample(
        self, prompt_ids: Sequence[int], *, max_new_tokens: int, seed: int | None = None
    ) -> ScriptedCompletion:
        """Return the scripted turn for this prompt, cut to ``max_new_tokens`` (``seed`` is recorded, unused)."""
        self.calls.append((list(prompt_ids), max_new_tokens))
        self.seeds.append(seed)
        prompt_text = self._tokenizer.decode(list(prompt_ids), skip_special_tokens=False)
        turn = max(prompt_text.count(self._header) - 1, 0)
        if callable(self._script):
            item = self._script(prompt_text, turn)
        else:
            item = self._script[min(turn, len(self._script) - 1)]
        if isinstance(item, BaseException):
            raise item
        ids = list(self._tokenizer.encode(item, add_special_tokens=False))
        eos_id = self._tokenizer.eos_token_id
        if self._eos and eos_id is not None:
            ids.append(int(eos_id))
        finish = "stop"
        if len(ids) > max_new_tokens:
            ids = ids[: max(max_new_tokens, 0)]
            finish = "length"
        return ScriptedCompletion(
            token_ids=ids,
            logprobs=[self._logprob] * len(ids),
            text=self._tokenizer.decode(ids, skip_special_tokens=True),
            finish_reason=finish,
        )
