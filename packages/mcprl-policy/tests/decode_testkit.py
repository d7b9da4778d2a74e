"""What the decode-engine tests share: a `DecodeEngine` built from a causal LM and its tokenizer the way the HF
sampler builds one (tokenizer's pad id and detokenizer, the end-of-turn ids as stops unless a test names its
own), with the knobs those tests vary as keywords; and the mixed workload (`mixed_workload`, `WORKLOAD_PARAMS`)
that the exactness tests run through two engines that must agree bit for bit."""

from __future__ import annotations

from typing import Any

import torch
from transformers import PreTrainedTokenizerBase

from mcprl_policy import SamplingParams
from mcprl_policy.batch_cache import KVLayout
from mcprl_policy.config import DecodeForward
from mcprl_policy.decode import DecodeEngine, DecodeRequest
from mcprl_policy.vocab import end_of_turn_ids


def build_engine(
    model: torch.nn.Module,
    tokenizer: PreTrainedTokenizerBase,
    *,
    params: SamplingParams,
    max_batch_size: int,
    prefix_cache_bytes: int = 2**26,
    kv_layout: KVLayout = "auto",
    stop_token_ids: frozenset[int] | None = None,
    decode_forward: DecodeForward = "auto",
) -> DecodeEngine:
    """A `DecodeEngine` on ``model``; ``stop_token_ids`` None stops at `end_of_turn_ids` of tokenizer and model."""
    pad: Any = tokenizer.pad_token_id
    return DecodeEngine(
        model,
        params=params,
        stop_token_ids=end_of_turn_ids(tokenizer, model) if stop_token_ids is None else stop_token_ids,
        pad_token_id=int(pad),
        max_batch_size=max_batch_size,
        decode=lambda ids: str(tokenizer.decode(ids)),
        prefix_cache_bytes=prefix_cache_bytes,
        kv_layout=kv_layout,
        decode_forward=decode_forward,
    )


def chat_ids(tokenizer: PreTrainedTokenizerBase, role: str, content: str) -> list[int]:
    """One ``role`` message rendered by the tokenizer's chat template, with the generation prompt."""
    ids: Any = tokenizer.apply_chat_template(
        [{"role": role, "content": content}], add_generation_prompt=True, tokenize=True, return_dict=False
    )
    return [int(t) for t in ids]


def prompt_ids(tokenizer: PreTrainedTokenizerBase, i: int) -> list[int]:
    """The ``i``-th first-turn prompt of the workload (lengths vary with ``i``)."""
    return chat_ids(tokenizer, "user", f"What is {i} times the price of ACME?" + " Please." * (i % 5))


def tool_turn_ids(tokenizer: PreTrainedTokenizerBase, i: int) -> list[int]:
    """The ``i``-th tool result as the environment appends it to an episode."""
    return chat_ids(tokenizer, "tool", f'{{"price": {i}.5}}' * (1 + i % 3))


def drain(engine: DecodeEngine, requests: list[DecodeRequest], *, waves: int) -> None:
    """Queue ``requests`` in ``waves`` parts, one engine call between parts: later ones join a running batch."""
    size = -(-len(requests) // waves)
    for start in range(0, len(requests), size):
        engine.pending.extend(requests[start : start + size])
        engine.run_until_finished()
    while not engine.idle:
        engine.run_until_finished()


def mixed_workload(
    engine: DecodeEngine, tokenizer: PreTrainedTokenizerBase, *, seeded: bool
) -> list[DecodeRequest]:
    """Fifteen first turns (2-30 new tokens), then a next turn for each (prefix-cache hits), staggered.

    The first three first turns share one prompt and are admitted together (one prefill for the three), and two
    copies of the last next turn are admitted with it (one prefill after a shared cached prefix).
    """
    first = [
        DecodeRequest(
            prompt_ids=prompt_ids(tokenizer, max(i - 2, 0)),
            max_new_tokens=(2, 9, 30, 5, 17, 3, 24, 11, 7, 20, 4, 13, 6, 15, 9)[i],
            seed=1000 + i if seeded and i % 3 else None,
        )
        for i in range(15)
    ]
    drain(engine, first, waves=4)
    second = [
        DecodeRequest(
            prompt_ids=[*r.prompt_ids, *r.token_ids, *tool_turn_ids(tokenizer, i)],
            max_new_tokens=3 + (7 * i) % 19,
            seed=2000 + i if seeded and i % 2 else None,
        )
        for i, r in enumerate(first)
    ]
    second += [
        DecodeRequest(
            prompt_ids=second[-1].prompt_ids, max_new_tokens=n, seed=3000 + n if seeded and n % 2 else None
        )
        for n in (4, 11)
    ]
    drain(engine, second[::-1], waves=3)
    return first + second


WORKLOAD_PARAMS: dict[str, tuple[SamplingParams, bool]] = {
    # The untrained tiny-8h's greedy choice is a newline, penalised or not: six of them are the stop string.
    "greedy, penalty, stop string": (
        SamplingParams(temperature=0.0, repetition_penalty=1.3, stop=("\n" * 6,)),
        False,
    ),
    "sampled, seeded and not": (SamplingParams(temperature=1.0, top_p=0.95, top_k=50, seed=7), True),
    "sampled, penalty, stop string": (
        SamplingParams(temperature=0.8, repetition_penalty=1.2, stop=("e",), seed=3),
        True,
    ),
}
"""Sampling cases of `mixed_workload`: (parameters, whether requests carry their own seeds)."""
