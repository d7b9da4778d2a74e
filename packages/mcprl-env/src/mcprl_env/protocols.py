"""The seams mcprl-env needs from the outside: a sampler, a chat tokenizer and a tool caller.

They are structural (`typing.Protocol`): the policy package satisfies `Sampler` without importing mcprl-env,
a transformers tokenizer satisfies `ChatTokenizer`, and `mcprl_tools.ToolManager` satisfies `ToolCaller`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

__all__ = ["ChatTokenizer", "Completion", "Sampler", "ToolCaller", "ToolOutcome", "ToolSpecLike"]


@runtime_checkable
class Completion(Protocol):
    """One sampled assistant turn.

    Attributes:
        token_ids: Exactly the sampled ids, including the end-of-turn id if it was sampled.
        logprobs: Sampling logprob of each id (same length as ``token_ids``).
        text: ``decode(token_ids)`` with special tokens skipped.
        finish_reason: ``"stop"`` (end-of-turn id or stop string) or ``"length"`` (hit ``max_new_tokens``).
        queue_s: Seconds the request waited in the sampler's own queue (behind other requests) before it was
            served; the episode's wall-clock budget does not count them (`mcprl_env.episode_clock`). 0 when the
            sampler cannot tell.
    """

    @property
    def token_ids(self) -> list[int]: ...
    @property
    def logprobs(self) -> list[float]: ...
    @property
    def text(self) -> str: ...
    @property
    def finish_reason(self) -> str: ...
    @property
    def queue_s(self) -> float: ...


class Sampler(Protocol):
    """Generates the next assistant turn from exact prompt token ids."""

    async def sample(
        self, prompt_ids: Sequence[int], *, max_new_tokens: int, seed: int | None = None
    ) -> Completion:
        """Sample at most ``max_new_tokens`` ids continuing ``prompt_ids``.

        ``seed`` (from `mcprl_env.seeds.turn_seed`) makes the draw a function of the prompt and the seed alone,
        whatever other requests are in flight; ``None``: the sampler's own randomness.
        """
        ...


class ChatTokenizer(Protocol):
    """The part of a (transformers) tokenizer the environment uses."""

    @property
    def eos_token_id(self) -> int | None: ...

    def apply_chat_template(
        self,
        conversation: Any,
        *,
        tools: Any = None,
        add_generation_prompt: bool = False,
        tokenize: bool = False,
        **kwargs: Any,
    ) -> Any:
        """Render ``conversation`` (a list of chat messages) with the tokenizer's chat template."""
        ...

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """Token ids of ``text``."""
        ...

    def decode(self, token_ids: Any, skip_special_tokens: bool = False) -> str:
        """Text of ``token_ids``."""
        ...


class ToolOutcome(Protocol):
    """What a tool call returns (satisfied by `mcprl_tools.ToolResult`).

    ``queue_s`` is how long the call waited before it was dispatched to its server (for the server's
    session, behind the server's concurrency cap): the episode's wall-clock budget does not count it.
    """

    @property
    def kind(self) -> str: ...
    @property
    def text(self) -> str: ...
    @property
    def error_type(self) -> str | None: ...
    @property
    def truncated(self) -> bool: ...
    @property
    def queue_s(self) -> float: ...


class ToolSpecLike(Protocol):
    """A tool in the catalogue (satisfied by `mcprl_tools.ToolSpec`)."""

    @property
    def name(self) -> str: ...
    @property
    def server(self) -> str: ...
    @property
    def tool(self) -> str: ...


class ToolCaller(Protocol):
    """The part of `mcprl_tools.ToolManager` the environment uses."""

    @property
    def tools(self) -> Sequence[ToolSpecLike]:
        """Every tool of every server, with its exposed name."""
        ...

    def tool_schemas(self, servers: Sequence[str] | None = None) -> list[dict[str, Any]]:
        """Chat-template tool schemas (``{"type": "function", "function": {...}}``) of ``servers``."""
        ...

    async def call(
        self, name: str, arguments: Mapping[str, Any] | None = None, *, episode_id: str | None = None
    ) -> ToolOutcome:
        """Call the tool exposed as ``name``; never raises for tool or infrastructure failures."""
        ...
