"""The compact Qwen/Hermes-style chat template shipped with the embedded tiny model.

Tools are rendered one line each, name and argument names only (``name(arg1, arg2)``), inside the system
turn: a model with a few million parameters cannot use a description, and descriptions made up two thirds of
every demo episode's tokens (the cost of every forward pass); assistant tool calls become
``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``; ``role: tool`` messages become one
``<tool_response>`` user turn each. The template is *prefix-stable*: rendering a longer conversation starts
with the rendering of any shorter prefix of it (with ``add_generation_prompt=True``) followed by the
assistant's content, because no message's rendering depends on the messages after it. Assistant content is
wrapped in ``{% generation %}`` so ``return_assistant_tokens_mask=True`` yields the assistant-token mask.
"""

from __future__ import annotations

__all__ = ["CHAT_TEMPLATE", "DEFAULT_SYSTEM_PROMPT"]

DEFAULT_SYSTEM_PROMPT = "You are a helpful assistant."

_RAW_TEMPLATE = (
    "{% macro render_content(content) %}"
    "{% if content is string %}{{ content }}"
    "{% elif content is none %}"
    "{% else %}{% for part in content %}{% if part.text is defined %}{{ part.text }}{% endif %}"
    "{% endfor %}{% endif %}"
    "{% endmacro %}"
    "{% if messages and messages[0].role == 'system' %}"
    "{% set system_text = render_content(messages[0].content) %}{% set rest = messages[1:] %}"
    "{% else %}"
    "{% set system_text = '" + DEFAULT_SYSTEM_PROMPT + "' if tools else '' %}{% set rest = messages %}"
    "{% endif %}"
    "{% if system_text or tools %}"
    "<|im_start|>system\n{{ system_text }}"
    "{% if tools %}"
    "\n\n# Tools"
    "{% for tool in tools %}"
    "{% set fn = tool.function if tool.function is defined else tool %}"
    "{% set props = fn.parameters.properties if fn.parameters is defined and fn.parameters.properties is defined"
    " else {} %}"
    "\n{{ fn.name }}({{ props.keys() | join(', ') }})"
    "{% endfor %}"
    '\n\nCall tools as <tool_call>{"name": ..., "arguments": {...}}</tool_call>.'
    " Give the final answer as <answer>...</answer>."
    "{% endif %}"
    "<|im_end|>\n"
    "{% endif %}"
    "{% for message in rest %}"
    "{% if message.role == 'assistant' %}"
    "<|im_start|>assistant\n"
    "{% generation %}"
    "{{ render_content(message.content) }}"
    "{% if message.tool_calls is defined and message.tool_calls %}"
    "{% for call in message.tool_calls %}"
    "{% set fn = call.function if call.function is defined else call %}"
    "{% if loop.first and render_content(message.content) %}\n{% elif not loop.first %}\n{% endif %}"
    '<tool_call>{"name": {{ fn.name | tojson }}, "arguments": '
    "{% if fn.arguments is string %}{{ fn.arguments }}{% else %}{{ fn.arguments | tojson }}{% endif %}"
    "}</tool_call>"
    "{% endfor %}"
    "{% endif %}"
    "<|im_end|>"
    "{% endgeneration %}"
    "\n"
    "{% elif message.role == 'tool' %}"
    "<|im_start|>user\n<tool_response>\n{{ render_content(message.content) }}\n</tool_response><|im_end|>\n"
    "{% else %}"
    "<|im_start|>{{ message.role }}\n{{ render_content(message.content) }}<|im_end|>\n"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

# transformers renders with trim_blocks/lstrip_blocks, which would eat literal newlines next to block tags:
# every newline is therefore emitted by an expression.
CHAT_TEMPLATE = _RAW_TEMPLATE.replace("\n", "{{ '\\n' }}")
