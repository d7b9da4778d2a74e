"""Assistant targets for any chat template, by rendering prefixes of the conversation and diffing.

For each assistant message ``k`` the targets are the text between the rendering of ``messages[:k]`` with the
generation prompt and the rendering of ``messages[:k + 1]``, up to and including the first end-of-turn token:
exactly what the sampler produces for that turn (it stops on that token). What the template appends after it
and renders for the environment's messages is context, encoded as the episode transcript encodes it (one
piece per stretch between turns), so a demonstration is the token sequence an episode would hold.

This needs rendering to be prefix-stable. Two departures are bridged by keeping the text as the model saw or
generated it: a template that re-renders the latest assistant turn once it is no longer last (Qwen3 drops its
empty ``<think></think>`` block), and one that re-renders the environment's messages since that turn once an
assistant message follows (Hermes 3 ends the last tool response without a newline). Any other rewrite of
earlier text is a `DemonstrationError` naming the message.
(TRL checks the same property, ``is_chat_template_prefix_preserving``, and swaps in patched training
templates; verifiers' ``process_chat_format`` tokenizes incremental prefixes and asserts it.)
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

from mcprl_env import ChatTokenizer
from mcprl_train.errors import DemonstrationError

__all__ = ["prefix_diff_targets"]


def prefix_diff_targets(
    tokenizer: ChatTokenizer,
    messages: Sequence[dict[str, Any]],
    weights: Sequence[int],
    *,
    tools: list[dict[str, Any]] | None,
    template_kwargs: dict[str, Any],
    end_of_turn: Collection[int],
) -> tuple[list[int], list[int]]:
    """Token ids and target mask of ``messages`` (one weight per assistant message, 0 or 1).

    Raises:
        DemonstrationError: rendering is not prefix-stable beyond the bridged case, or an assistant turn
            renders without an end-of-turn token (the sampler could never end it).
    """

    def render(upto: int, generation_prompt: bool) -> str:
        text = tokenizer.apply_chat_template(
            list(messages[:upto]),
            tools=tools,
            add_generation_prompt=generation_prompt,
            tokenize=False,
            **template_kwargs,
        )
        if not isinstance(text, str):
            raise TypeError(f"apply_chat_template(tokenize=False) returned {type(text).__name__}, not str")
        return text

    markers = sorted({tokenizer.decode([i], skip_special_tokens=False) for i in end_of_turn})
    pieces: list[tuple[str, int | None]] = []  # (text, None for context or the turn's weight)
    # The latest assistant turn: (its index, the rendering it ends, the text after its end-of-turn token).
    previous: tuple[int, str, str] | None = None
    assistants = [k for k, m in enumerate(messages) if m.get("role") == "assistant"]
    for k, weight in zip(assistants, weights, strict=True):
        prompt = render(k, True)
        pieces.append((_context(prompt, previous, render, markers, k), None))
        whole = render(k + 1, False)
        turn = _turn(prompt, whole, render(k, False), previous, k)
        cut = _end_after(turn, markers, 0)
        if cut is None:
            raise DemonstrationError(
                f"message {k} (assistant): the template renders it without an end-of-turn token "
                f"({', '.join(markers)}), so the sampler could never end this turn: {turn[-60:]!r}"
            )
        pieces.append((turn[:cut], weight))
        previous = (k, whole, turn[cut:])
    if previous is not None and previous[0] + 1 < len(messages):
        pieces.append(
            (_context(render(len(messages), False), previous, render, markers, len(messages)), None)
        )
    elif previous is not None:
        pieces.append((previous[2], None))
    return _encode(tokenizer, pieces, end_of_turn)


def _context(
    rendered: str,
    previous: tuple[int, str, str] | None,
    render: Any,
    markers: Sequence[str],
    k: int,
) -> str:
    """The context text before message ``k``: what ``rendered`` adds after the previous assistant turn."""
    if previous is None:
        return rendered
    j, held, after = previous
    if rendered.startswith(held):
        return after + rendered[len(held) :]
    at = _first_difference(held, rendered)
    before: str = render(j, False)
    end = _end_after(rendered, markers, at)
    if not (held.startswith(before) and rendered.startswith(before) and at >= len(before)) or end is None:
        raise DemonstrationError(
            f"message {k}: the chat template is not prefix-stable: rendering messages[:{k}] rewrites text before "
            f"assistant message {j} (at char {at}: {held[at : at + 40]!r} became {rendered[at : at + 40]!r}), "
            "so no token sequence is both what the model generated and what the template renders"
        )
    # The template re-renders only the latest assistant turn (Qwen3 drops its empty think block once it is
    # not last); keep the turn as generated, as the episode transcript does, and continue after it.
    return rendered[end:]


def _turn(prompt: str, whole: str, base: str, previous: tuple[int, str, str] | None, k: int) -> str:
    """The text the template renders for assistant message ``k`` after the generation prompt."""
    if whole.startswith(prompt):
        return whole[len(prompt) :]
    at = _first_difference(prompt, whole)
    generation_prompt = prompt[len(base) :] if prompt.startswith(base) else ""
    start = whole.rfind(generation_prompt) if generation_prompt else -1
    held = previous[1] if previous is not None else None
    confined = held is not None and prompt.startswith(held) and whole.startswith(held) and at >= len(held)
    if not confined or start < at:
        raise DemonstrationError(
            f"message {k} (assistant): the chat template is not prefix-stable: appending the message rewrites "
            f"earlier text (at char {at}: {prompt[at : at + 40]!r} became {whole[at : at + 40]!r})"
        )
    # The template renders the environment's messages since the last turn differently once an assistant
    # message follows (Hermes 3 ends the last tool response without a newline); the model saw the prompt as
    # it was, so the turn is what follows the generation prompt in the longer rendering.
    return whole[start + len(generation_prompt) :]


def _encode(
    tokenizer: ChatTokenizer, pieces: Sequence[tuple[str, int | None]], end_of_turn: Collection[int]
) -> tuple[list[int], list[int]]:
    """Encode each piece on its own (context stretches as the transcript does, each turn as sampled)."""
    ids: list[int] = []
    mask: list[int] = []
    for text, weight in pieces:
        piece = list(tokenizer.encode(text, add_special_tokens=False)) if text else []
        if weight is not None and (not piece or piece[-1] not in end_of_turn):
            raise DemonstrationError(
                f"an assistant turn does not encode to a final end-of-turn token: {text[-60:]!r}"
            )
        ids.extend(piece)
        mask.extend([weight or 0] * len(piece))
    return ids, mask


def _end_after(text: str, markers: Sequence[str], start: int) -> int | None:
    """The end of the first end-of-turn marker in ``text`` at or after ``start``."""
    found = [(i, i + len(m)) for m in markers if m and (i := text.find(m, start)) >= 0]
    return min(found)[1] if found else None


def _first_difference(a: str, b: str) -> int:
    n = min(len(a), len(b))
    return next((i for i in range(n) if a[i] != b[i]), n)
