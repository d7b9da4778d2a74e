"""Token-exact bookkeeping of one conversation.

The transcript holds the exact ids an episode is trained on: the rendered prompt, each assistant turn exactly
as sampled (mask 1, with its logprobs), and for each environment step only the ids of the text the chat
template appends (tool responses and scaffolding; mask 0). Before appending, the whole conversation is
re-rendered and must start with exactly the text already held: a template that rewrites earlier turns is
detected (`TemplateDriftError`) instead of silently training on text the model never saw.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from mcprl_env.errors import TemplateDriftError
from mcprl_env.protocols import ChatTokenizer, Completion

__all__ = ["Transcript"]


def _first_difference(a: str, b: str) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


class Transcript:
    """Messages plus the token ids, loss mask and logprobs they were trained as.

    Args:
        tokenizer: Chat tokenizer (renders and encodes).
        on_drift: ``"raise"`` or ``"report"`` (see `EnvConfig.on_template_drift`).
        template_kwargs: Extra ``apply_chat_template`` keyword arguments.
    """

    def __init__(
        self,
        tokenizer: ChatTokenizer,
        *,
        on_drift: Literal["raise", "report"] = "raise",
        template_kwargs: dict[str, Any] | None = None,
    ) -> None:
        self._tok = tokenizer
        self._tools: list[dict[str, Any]] | None = None
        self._on_drift = on_drift
        self._kwargs = dict(template_kwargs or {})
        self.messages: list[dict[str, Any]] = []
        self.token_ids: list[int] = []
        self.loss_mask: list[int] = []
        self.logprobs: list[float] = []
        self.text = ""
        self.prompt_length = 0
        self.sampled_tokens = 0
        self.env_tokens = 0
        self.drift_count = 0
        self._last_sampled_text = ""

    def render(self, messages: Sequence[dict[str, Any]], *, add_generation_prompt: bool) -> str:
        """The chat template's text for ``messages``."""
        text = self._tok.apply_chat_template(
            list(messages),
            tools=self._tools,
            add_generation_prompt=add_generation_prompt,
            tokenize=False,
            **self._kwargs,
        )
        if not isinstance(text, str):
            raise TypeError(f"apply_chat_template(tokenize=False) returned {type(text).__name__}, not str")
        return text

    def start(self, messages: Sequence[dict[str, Any]], *, tools: Sequence[dict[str, Any]] | None) -> None:
        """Render the opening conversation (with ``tools`` in the template) plus the generation prompt."""
        self._tools = list(tools) if tools else None
        self.messages = [dict(m) for m in messages]
        self.text = self.render(self.messages, add_generation_prompt=True)
        self.token_ids = list(self._tok.encode(self.text, add_special_tokens=False))
        self.loss_mask = [0] * len(self.token_ids)
        self.logprobs = [0.0] * len(self.token_ids)
        self.prompt_length = len(self.token_ids)

    def add_sampled(self, completion: Completion) -> None:
        """Append a sampled assistant turn exactly as sampled and record it as an assistant message.

        The message content is the decoded turn without a trailing end-of-turn id, which the template adds
        back when it renders the message.
        """
        ids = [int(t) for t in completion.token_ids]
        if len(completion.logprobs) != len(ids):
            raise ValueError(f"sampler returned {len(ids)} ids but {len(completion.logprobs)} logprobs")
        sampled_text = self._tok.decode(ids, skip_special_tokens=False)
        content_ids = ids[:-1] if ids and ids[-1] == self._tok.eos_token_id else ids
        self.token_ids.extend(ids)
        self.loss_mask.extend([1] * len(ids))
        self.logprobs.extend(float(x) for x in completion.logprobs)
        self.sampled_tokens += len(ids)
        self.text += sampled_text
        self._last_sampled_text = sampled_text
        self.messages.append(
            {"role": "assistant", "content": self._tok.decode(content_ids, skip_special_tokens=False)}
        )

    def env_suffix(self, new_messages: Sequence[dict[str, Any]]) -> tuple[str, list[int], bool]:
        """Text and ids the template appends for ``new_messages`` (plus the next generation prompt).

        Returns:
            ``(suffix_text, suffix_ids, drifted)``; nothing is appended yet (see `commit_env`).

        Raises:
            TemplateDriftError: The re-render does not start with the held text and ``on_drift="raise"``, or
                the drift cannot be bridged in ``"report"`` mode.
        """
        conversation = [*self.messages, *new_messages]
        rendered = self.render(conversation, add_generation_prompt=True)
        if rendered.startswith(self.text):
            suffix = rendered[len(self.text) :]
            return suffix, list(self._tok.encode(suffix, add_special_tokens=False)), False
        at = _first_difference(self.text, rendered)
        drift = TemplateDriftError(
            at, self.text[at : at + 80], rendered[at : at + 80], before=self.text[max(0, at - 30) : at]
        )
        if self._on_drift == "raise":
            raise drift
        # Report mode: keep the sampled ids and append what the template adds after the held conversation.
        held = self.render(self.messages, add_generation_prompt=False)
        if not rendered.startswith(held):
            raise drift
        tail = ""
        end = held.rfind(self._last_sampled_text) if self._last_sampled_text else -1
        if end >= 0:
            tail = held[end + len(self._last_sampled_text) :]
        suffix = tail + rendered[len(held) :]
        return suffix, list(self._tok.encode(suffix, add_special_tokens=False)), True

    def commit_env(
        self, new_messages: Sequence[dict[str, Any]], suffix: str, ids: Sequence[int], drifted: bool
    ) -> None:
        """Append environment messages and their ids (mask 0)."""
        self.messages.extend(dict(m) for m in new_messages)
        self.token_ids.extend(ids)
        self.loss_mask.extend([0] * len(ids))
        self.logprobs.extend([0.0] * len(ids))
        self.env_tokens += len(ids)
        self.text += suffix
        self.drift_count += int(drifted)
