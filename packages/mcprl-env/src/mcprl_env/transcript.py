"""Token-exact bookkeeping of one conversation.

The transcript holds the exact ids an episode is trained on: the rendered prompt, each assistant turn exactly
as sampled (mask 1, with its logprobs), and for each environment step only the ids of the text the chat
template renders after the turn just sampled (tool responses and the next generation prompt; mask 0).

The suffix is what the new rendering has after the end-of-turn marker of the turn just sampled, so the text a
template legitimately rewrites once a turn is no longer the newest stays as the model saw or generated it:

- the turn itself, from its generation prompt to its end-of-turn marker (Qwen3 drops the think block of an
  assistant turn that is no longer last, empty or not);
- whitespace in the environment's messages since the previous turn (Hermes 3 ends the last tool response
  without a newline until an assistant message follows).

Everything before the previous turn's end (the system prompt, the user's messages, older turns as the template
rendered them last time) must render exactly as before, and the environment's messages may change only in
whitespace; anything else is a `TemplateDriftError`, since no token sequence is then both what the model saw
and what the template renders. This is the convention of the SFT warm start (``mcprl_train``'s chat masks),
so a demonstration and an episode of the same conversation are the same ids.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import attrs

from mcprl_env.errors import TemplateDriftError
from mcprl_env.protocols import ChatTokenizer, Completion

__all__ = ["EnvSuffix", "Transcript"]


@attrs.frozen(kw_only=True)
class EnvSuffix:
    """What one environment step appends (see `Transcript.env_suffix`; nothing is appended until committed).

    Attributes:
        messages: The environment's messages.
        text: The template's text after the turn just sampled, up to and including the next generation prompt.
        ids: ``text`` encoded (mask 0).
        drifted: The template rewrote earlier text beyond what the transcript bridges (``"report"`` mode).
        rendered: The whole conversation as the template renders it now (``text`` is its tail).
    """

    messages: tuple[dict[str, Any], ...]
    text: str
    ids: list[int]
    drifted: bool
    rendered: str


def _first_difference(a: str, b: str, start: int = 0) -> int:
    n = min(len(a), len(b))
    for i in range(start, n):
        if a[i] != b[i]:
            return i
    return max(start, n)


def _common_prefix(a: str, b: str) -> int:
    return len(a) if b.startswith(a) else _first_difference(a, b)


def _match_up_to_whitespace(old: str, start: int, stop: int, new: str) -> tuple[int, int]:
    """Walk ``old[start:stop]`` and ``new[start:]`` side by side, skipping whitespace in either.

    Returns:
        ``(i, k)``: ``i == stop`` when they agree up to whitespace, ``k`` the matching position in ``new``;
        otherwise the first positions that differ.
    """
    i, k = start, start
    while i < stop:
        if k < len(new) and old[i] == new[k]:
            i, k = i + 1, k + 1
        elif old[i].isspace():
            i += 1
        elif k < len(new) and new[k].isspace():
            k += 1
        else:
            break
    return i, k


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
        # The rendering the latest prompt's text was cut from; in it, where the environment's text since the
        # previous turn starts and where the generation prompt starts. Then the turn sampled after it. The
        # generation prompt's start costs a second rendering, and only a template that rewrites earlier text
        # needs it, so it is found on first use (`_prompt_start_in_rendered`).
        self._rendered = ""
        self._env_start = 0
        self._prompt_start: int | None = 0
        self._prompt_messages = 0  # how many messages that rendering holds
        self._sampled_text = ""
        self._end_marker = ""

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
        self._rendered = self.text
        # Nothing before the first generation prompt may change: there is no environment text to bridge.
        self._prompt_start = _common_prefix(
            self.render(self.messages, add_generation_prompt=False), self.text
        )
        self._env_start = self._prompt_start

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
        self._sampled_text = sampled_text
        # The id that ended the turn, when it is a special token (the sampler stops on end-of-turn ids).
        last = ids[-1:]
        special = bool(last) and not self._tok.decode(last, skip_special_tokens=True)
        self._end_marker = self._tok.decode(last, skip_special_tokens=False) if special else ""
        self.messages.append(
            {"role": "assistant", "content": self._tok.decode(content_ids, skip_special_tokens=False)}
        )

    def env_suffix(self, new_messages: Sequence[dict[str, Any]]) -> EnvSuffix:
        """What the template renders for ``new_messages`` (and the next generation prompt) after the turn.

        Returns:
            The suffix; nothing is appended yet (see `commit_env`).

        Raises:
            TemplateDriftError: The template rewrites text other than the latest turn and whitespace of the
                environment's messages since the previous turn, and ``on_drift="raise"``; or, in ``"report"``
                mode, the new rendering has no end-of-turn marker where the turn just sampled should end.
        """
        conversation = [*self.messages, *new_messages]
        rendered = self.render(conversation, add_generation_prompt=True)
        end = self._turn_end(rendered)
        drifted = isinstance(end, TemplateDriftError)
        if isinstance(end, TemplateDriftError):
            bridged = self._nth_end_marker(rendered) if self._on_drift == "report" else None
            if bridged is None:
                raise end
            end = bridged
        text = rendered[end:]
        return EnvSuffix(
            messages=tuple(dict(m) for m in new_messages),
            text=text,
            ids=list(self._tok.encode(text, add_special_tokens=False)),
            drifted=drifted,
            rendered=rendered,
        )

    def commit_env(self, suffix: EnvSuffix) -> None:
        """Append the environment's messages and their ids (mask 0)."""
        self.messages.extend(dict(m) for m in suffix.messages)
        self.token_ids.extend(suffix.ids)
        self.loss_mask.extend([0] * len(suffix.ids))
        self.logprobs.extend([0.0] * len(suffix.ids))
        self.env_tokens += len(suffix.ids)
        self.text += suffix.text
        self.drift_count += int(suffix.drifted)
        self._rendered = suffix.rendered
        self._env_start = len(suffix.rendered) - len(suffix.text)
        self._prompt_start = None
        self._prompt_messages = len(self.messages)

    def _prompt_start_in_rendered(self) -> int:
        """Where the generation prompt starts in the rendering the latest prompt was cut from."""
        if self._prompt_start is None:
            without = self.render(self.messages[: self._prompt_messages], add_generation_prompt=False)
            self._prompt_start = max(_common_prefix(without, self._rendered), self._env_start)
        return self._prompt_start

    def _turn_end(self, rendered: str) -> int | TemplateDriftError:
        """Where the turn just sampled ends in ``rendered`` (after its end-of-turn marker), or the drift."""
        old, env = self._rendered, self._env_start
        held = old + self._sampled_text
        if rendered.startswith(held):
            return len(held)
        prompt = self._prompt_start_in_rendered()
        if not rendered.startswith(old[:env]):
            return self._drift(held, rendered, _first_difference(held, rendered))
        i, k = _match_up_to_whitespace(old, env, prompt, rendered)
        if i < prompt:
            return self._drift(held, rendered, i, k)
        found = rendered.find(self._end_marker, k) if self._end_marker else -1
        if found < 0:
            return self._drift(held, rendered, _first_difference(held, rendered, prompt), k)
        return found + len(self._end_marker)

    def _nth_end_marker(self, rendered: str) -> int | None:
        """The end of the marker that ends the turn just sampled, counted from the start (``"report"`` mode)."""
        marker = self._end_marker
        if not marker:
            return None
        at = -len(marker)
        for _ in range(self._rendered.count(marker, 0, self._prompt_start_in_rendered()) + 1):
            at = rendered.find(marker, at + len(marker))
            if at < 0:
                return None
        return at + len(marker)

    @staticmethod
    def _drift(held: str, rendered: str, at: int, at_rendered: int | None = None) -> TemplateDriftError:
        k = at if at_rendered is None else at_rendered
        return TemplateDriftError(
            at, held[at : at + 80], rendered[k : k + 80], before=held[max(0, at - 30) : at]
        )
