"""Attention kernels for the training forward: flash-attention-2 varlen where installed, per-sequence SDPA else.

Packed training puts many sequences in one row. Attention must not cross from one sequence to the next:

- ``flash_attention_2`` (flash-attn installed, CUDA): transformers' varlen kernel, given the sequences'
  cumulative lengths (``cu_seq_lens_q/k``, ``max_length_q/k``; transformers' ``FlashAttentionKwargs``).
- ``mcprl_varlen_sdpa`` (`VARLEN_SDPA`, registered here with transformers' ``AttentionInterface``): with
  those same keyword arguments it runs causal SDPA on each sequence's slice, O(Σ nᵢ²) instead of the O(N²)
  of SDPA with a block-diagonal mask; without them (padded rows, the sampler's KV-cached decode) it is
  transformers' own ``sdpa`` path, mask and all, so everything else computes exactly what ``sdpa`` does;
  a decode step on the CPU (one query per row) runs `decode_sdpa`, the same bits without copying the cache per
  head group.
- ``sdpa`` / ``eager``: packed rows get transformers' block-diagonal mask (O(N²)), still exact.

Models with linear-attention layers (Qwen3.5 / Qwen3-Next gated delta nets) carry a recurrent state along
the row; their torch kernels ignore sequence boundaries, so such models are not packed at all
(`check_packable`).
"""

from __future__ import annotations

import importlib.util
from itertools import pairwise
from typing import Any, Final, assert_never

import structlog
import torch
import torch.nn.functional as F
from torch import nn
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import repeat_kv, sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from mcprl_policy.config import AttnImplementation
from mcprl_policy.errors import PolicyError, UnpackableModelError

__all__ = [
    "VARLEN_IMPLEMENTATIONS",
    "VARLEN_SDPA",
    "check_packable",
    "decode_sdpa",
    "is_packable",
    "resolve_attn_implementation",
    "row_windows",
    "uses_varlen",
    "varlen_sdpa_attention",
]

_log = structlog.get_logger()

VARLEN_SDPA: Final = "mcprl_varlen_sdpa"

VARLEN_IMPLEMENTATIONS: Final = frozenset({"flash_attention_2", "flash_attention_3", VARLEN_SDPA})
"""Implementations whose packed forward takes ``cu_seq_lens`` instead of a block-diagonal mask."""

LINEAR_ATTENTION_LAYER: Final = "linear_attention"


PER_ROW_MIN_WINDOW: Final = 256
"""The narrowest decode window that `decode_sdpa` may split into one attention call per row."""

PER_ROW_MIN_MASKED: Final = 64
"""The fewest masked leading columns per row, on average, for which `decode_sdpa` splits the window by row."""


def decode_sdpa(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    mask: torch.Tensor | None,
    *,
    scale: float | None,
    groups: int,
) -> torch.Tensor | None:
    """One decode step's attention on the CPU: ``(B, H, 1, D)``; None elsewhere (the caller runs transformers'
    SDPA as it is).

    transformers copies the cache for grouped-query heads (``repeat_kv``) whenever there is a mask, because
    CUDA's fused kernels take no mask with ``enable_gqa``. torch's CPU kernel does, and gives the same bits
    without the copy: at 32 rows of 700 cached tokens, 3 KV heads for 9 query heads, one layer's attention takes
    3.6 ms instead of 58 ms (``benchmarks/RESULTS.md``, "decode attention on the CPU"). Keys and values in
    bfloat16 are widened to float32 first (exact): the CPU kernel at one query per row runs ~5x slower in
    bfloat16 on these shapes; the output is rounded back.

    Rows of different lengths share one window, the longest row's, the shorter ones masked on the left. When
    that masking is most of the work (a window of at least `PER_ROW_MIN_WINDOW` columns with at least
    `PER_ROW_MIN_MASKED` masked leading columns per row on average: episodes at different turns), each row
    attends from its own first column in a call of its own (`row_windows`), which skips the masked columns
    instead of computing and discarding them: 1.5x faster at 64 rows of 2,000 columns 40 % masked, slower on
    short windows, where one call's overhead per row outweighs what it skips. A row's result then depends on its
    own columns only, not on the batch's window.

    Args:
        query: ``(B, H, 1, D)``.
        key: ``(B, H_kv, L, D)`` (a strided window of the cache is fine).
        value: ``(B, H_kv, L, D)``.
        mask: ``(B, 1, 1, L)`` boolean (True: attend) or None.
        scale: softmax scale (None: ``D ** -0.5``).
        groups: query heads per KV head.
    """
    if query.shape[2] != 1 or query.device.type != "cpu":
        return None
    widen = key.dtype == torch.bfloat16

    def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, m: torch.Tensor | None) -> torch.Tensor:
        return F.scaled_dot_product_attention(
            q.float() if widen else q,
            k.float() if widen else k,
            v.float() if widen else v,
            attn_mask=m,
            dropout_p=0.0,
            scale=scale,
            is_causal=False,
            enable_gqa=groups > 1,
        )

    windows = row_windows(mask, query.shape[0])
    if windows is None:
        out = attend(query, key, value, mask)
    else:
        assert mask is not None
        out = torch.cat(
            [
                attend(
                    query[r : r + 1],
                    key[r : r + 1, :, first:],
                    value[r : r + 1, :, first:],
                    None if dense else mask[r : r + 1, :, :, first:],
                )
                for r, (first, dense) in enumerate(windows)
            ]
        )
    return out.to(query.dtype)


def row_windows(mask: torch.Tensor | None, rows: int) -> list[tuple[int, bool]] | None:
    """Per row of a decode step's ``(rows, 1, 1, L)`` boolean mask: its first attended column and whether it
    attends every column from there; None where one call over the whole window is cheaper (`decode_sdpa`)."""
    if mask is None or mask.dtype != torch.bool or mask.dim() != 4 or mask.shape[0] != rows:
        return None
    width = mask.shape[-1]
    if width < PER_ROW_MIN_WINDOW or mask.shape[1] != 1 or mask.shape[2] != 1:
        return None
    flat = mask.reshape(rows, width)
    first = flat.int().argmax(-1)  # the first True column
    if float(first.float().mean()) < PER_ROW_MIN_MASKED:
        return None
    dense = flat.sum(-1) == width - first
    return list(zip(first.tolist(), dense.tolist(), strict=True))


def varlen_sdpa_attention(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    *,
    cu_seq_lens_q: torch.Tensor | None = None,
    cu_seq_lens_k: torch.Tensor | None = None,
    max_length_q: int | None = None,
    max_length_k: int | None = None,
    **kwargs: Any,  # transformers' attention kwargs (sliding_window, position_ids, ...), passed through
) -> tuple[torch.Tensor, None]:
    """Causal SDPA on each packed sequence's slice, or transformers' ``sdpa`` when no ``cu_seq_lens`` are given.

    Args:
        module: the attention module (``num_key_value_groups`` for grouped-query attention).
        query: ``(1, H, N, D)`` queries of the packed row.
        key: ``(1, H_kv, N, D)`` keys.
        value: ``(1, H_kv, N, D)`` values.
        attention_mask: must be ``None`` with ``cu_seq_lens`` (the boundaries are the mask).
        dropout: attention dropout probability.
        scaling: softmax scale (``None``: ``D ** -0.5``).
        cu_seq_lens_q: ``(S + 1,)`` cumulative sequence lengths starting at 0; must equal ``cu_seq_lens_k``.
        cu_seq_lens_k: same as ``cu_seq_lens_q`` (self-attention without a cache).
        max_length_q: longest sequence (unused: each slice has its own length).
        max_length_k: same.
        kwargs: the rest of transformers' attention keyword arguments.

    Returns:
        ``(1, N, H, D)`` attention outputs and no weights, as transformers' attention functions return.
    """
    del max_length_q, max_length_k
    if cu_seq_lens_q is None and cu_seq_lens_k is None:
        groups = int(getattr(module, "num_key_value_groups", 1))
        fast = (
            None if dropout else decode_sdpa(query, key, value, attention_mask, scale=scaling, groups=groups)
        )
        if fast is not None:
            return fast.transpose(1, 2).contiguous(), None
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    if cu_seq_lens_q is None or cu_seq_lens_k is None or not torch.equal(cu_seq_lens_q, cu_seq_lens_k):
        raise ValueError("varlen SDPA needs cu_seq_lens_q == cu_seq_lens_k (self-attention, no KV cache)")
    if attention_mask is not None:
        raise ValueError("varlen SDPA takes sequence boundaries (cu_seq_lens), not an attention mask as well")
    if query.shape[0] != 1 or query.shape[2] != key.shape[2]:
        raise ValueError(
            f"varlen SDPA needs one packed row of queries and keys alike, got {tuple(query.shape)} and "
            f"{tuple(key.shape)}"
        )
    groups = int(getattr(module, "num_key_value_groups", 1))
    key, value = repeat_kv(key, groups), repeat_kv(value, groups)
    bounds: list[int] = cu_seq_lens_q.tolist()
    if bounds[0] != 0 or bounds[-1] != query.shape[2] or any(b <= a for a, b in pairwise(bounds)):
        raise ValueError(f"cu_seq_lens must rise strictly from 0 to {query.shape[2]}, got {bounds[:8]}...")
    outputs = [
        F.scaled_dot_product_attention(
            query[:, :, start:end],
            key[:, :, start:end],
            value[:, :, start:end],
            dropout_p=dropout,
            is_causal=True,
            scale=scaling,
        )
        for start, end in pairwise(bounds)
    ]
    return torch.cat(outputs, dim=2).transpose(1, 2).contiguous(), None


AttentionInterface.register(VARLEN_SDPA, varlen_sdpa_attention)
AttentionMaskInterface.register(VARLEN_SDPA, sdpa_mask)


def _flash_attention_2_installed() -> bool:
    return importlib.util.find_spec("flash_attn") is not None


def resolve_attn_implementation(requested: AttnImplementation, device: str) -> str:
    """The attention implementation to load a model with on ``device`` (logged as ``attention_implementation``).

    Raises:
        PolicyError: ``flash_attention_2`` requested without flash-attn installed or off CUDA.
    """
    on_cuda = torch.device(device).type == "cuda"
    match requested:
        case "auto":
            chosen = "flash_attention_2" if on_cuda and _flash_attention_2_installed() else VARLEN_SDPA
        case "flash_attention_2":
            if not on_cuda:
                raise PolicyError(
                    f"attn_implementation 'flash_attention_2' needs a CUDA device, the model is on {device!r}: "
                    f"use 'auto' (picks {VARLEN_SDPA!r} off CUDA)"
                )
            if not _flash_attention_2_installed():
                raise PolicyError(
                    "attn_implementation 'flash_attention_2' needs the flash-attn package: "
                    "`uv pip install flash-attn --no-build-isolation` (CUDA toolkit and a matching torch), "
                    f"or use 'auto' / {VARLEN_SDPA!r}"
                )
            chosen = requested
        case "mcprl_varlen_sdpa" | "sdpa" | "eager":
            chosen = requested
        case _:
            assert_never(requested)
    _log.info("attention_implementation", requested=requested, chosen=chosen, device=device)
    return chosen


def uses_varlen(model: nn.Module) -> bool:
    """Whether ``model`` was loaded with an implementation that takes ``cu_seq_lens`` (see `VARLEN_IMPLEMENTATIONS`)."""
    config = getattr(model, "config", None)
    return getattr(config, "_attn_implementation", None) in VARLEN_IMPLEMENTATIONS


def is_packable(model: nn.Module) -> bool:
    """Whether ``model`` can run several sequences packed in one row: no layer carries state along the row.

    transformers' torch kernels for gated delta nets (``torch_chunk_gated_delta_rule``, ``causal_conv1d_fn``)
    ignore ``cu_seq_lens``: the recurrent state and the short convolution run on from one packed sequence into
    the next, so models with linear-attention layers are not packable.
    """
    config = getattr(model, "config", None)
    text_config = getattr(config, "text_config", None) or config
    layer_types = getattr(text_config, "layer_types", None) or ()
    return LINEAR_ATTENTION_LAYER not in layer_types


def check_packable(model: nn.Module) -> None:
    """Refuse models that `is_packable` rejects.

    Raises:
        UnpackableModelError: naming the layer type and the padded layout to use instead.
    """
    if not is_packable(model):
        raise UnpackableModelError(
            f"{type(model).__name__} has {LINEAR_ATTENTION_LAYER!r} layers whose recurrent state would leak from "
            "one packed sequence into the next: use the padded layout (optim.layout: padded)"
        )
