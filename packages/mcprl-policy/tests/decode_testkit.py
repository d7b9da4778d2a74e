"""What the decode-engine tests share: a `DecodeEngine` built from a causal LM and its tokenizer the way the HF
sampler builds one (tokenizer's pad id and detokenizer, the end-of-turn ids as stops unless a test names its
own), with the knobs those tests vary as keywords."""

from __future__ import annotations

from typing import Any

import torch
from transformers import PreTrainedTokenizerBase

from mcprl_policy import SamplingParams
from mcprl_policy.batch_cache import KVLayout
from mcprl_policy.decode import DecodeEngine
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
    )
