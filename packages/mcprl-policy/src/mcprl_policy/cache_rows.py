"""Rows of a transformers ``DynamicCache`` moved between batches: the decode engine's cache surgery.

Continuous batching keeps one cache for every running row and rebuilds it when rows join (`concat_rows`),
leave (`select_rows`) or resume from a cached prefix (`cache_from_rows`); a finished row is kept as per-layer
`RowState`\\ s (`row_state`). Two kinds of layer are supported:

- ``attention`` (``DynamicLayer``, full attention): keys and values per position ``(B, kv_heads, T, head_dim)``,
  left-padded to a common width; a row's state is its unpadded columns, valid for any prefix of them.
- ``recurrent`` (``LinearAttentionLayer``: the gated delta rule of Qwen3.5, Yang, Kautz & Hatamizadeh 2025,
  "Gated Delta Networks: Improving Mamba2 with Delta Rule"): one causal-conv state ``(B, conv_dim, kernel)`` and one recurrent state
  ``(B, heads, k_dim, v_dim)`` per row, with no position axis. A row's state holds for exactly the tokens
  consumed so far: it cannot be cut back to a shorter prefix, and nothing may be fed between it and the next
  tokens (a masked pad still decays the recurrent state: ``g = -exp(A) softplus(dt_bias)`` is not 0 at a pad).
  Left padding *before* the first token is exact: the model zeroes padded inputs, so the conv sees the zeros it
  would pad with anyway and the delta rule keeps a zero state zero.

Other layer kinds (sliding-window, chunked, indexed, quantized caches, mamba-style conv-only states) are
refused by `check_supported` when the engine is built, naming the layer types and what to use instead.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final, Literal, TypeVar, assert_never

import attrs
import torch
from torch import nn
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer, LinearAttentionLayer

from mcprl_policy.errors import SamplerError

__all__ = [
    "AttentionRow",
    "LayerKind",
    "RecurrentRow",
    "RowState",
    "cache_from_rows",
    "check_supported",
    "concat_rows",
    "has_recurrent_layers",
    "row_state",
    "select_rows",
]

LayerKind = Literal["attention", "recurrent"]

_LAYER_KINDS: Final[dict[str, LayerKind]] = {"full_attention": "attention", "linear_attention": "recurrent"}

# Model types whose linear-attention layers zero padded inputs and keep one conv + one recurrent state per layer
# (``Qwen3_5GatedDeltaNet``), verified against ``generate`` in tests/test_hybrid_decode.py.
RECURRENT_MODEL_TYPES: Final = frozenset({"qwen3_5_text", "qwen3_5"})


@attrs.frozen(kw_only=True, eq=False)
class AttentionRow:
    """One row's keys and values, ``(kv_heads, L, head_dim)`` each, no padding."""

    keys: torch.Tensor
    values: torch.Tensor

    @property
    def length(self) -> int:
        return int(self.keys.shape[1])

    @property
    def nbytes(self) -> int:
        return _nbytes(self.keys, self.values)


@attrs.frozen(kw_only=True, eq=False)
class RecurrentRow:
    """One row's linear-attention state after its last consumed token: conv ``(conv_dim, kernel)``,
    recurrent ``(heads, k_dim, v_dim)``."""

    conv: torch.Tensor
    recurrent: torch.Tensor

    @property
    def nbytes(self) -> int:
        return _nbytes(self.conv, self.recurrent)


RowState = AttentionRow | RecurrentRow
_Row = TypeVar("_Row", AttentionRow, RecurrentRow)


def _nbytes(*tensors: torch.Tensor) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def check_supported(model: nn.Module) -> None:
    """Raise unless the engine can batch, split and resume ``model``'s cache row by row.

    Raises:
        SamplerError: a layer type other than ``full_attention`` / ``linear_attention``, or linear attention in
            a model type whose padding behaviour has not been verified.
    """
    config = getattr(model, "config", None)
    model_type = str(getattr(config, "model_type", ""))
    layer_types: list[str] = list(getattr(config, "layer_types", None) or ["full_attention"])
    unsupported = sorted({t for t in layer_types if t not in _LAYER_KINDS})
    if unsupported:
        raise SamplerError(
            f"the HF sampler cannot batch the cache of {model_type!r}: its layer types {unsupported} are not "
            "supported (full_attention and linear_attention are); use sampler.backend=vllm for this model"
        )
    if "linear_attention" in layer_types and model_type not in RECURRENT_MODEL_TYPES:
        raise SamplerError(
            f"the HF sampler supports linear-attention layers only in {sorted(RECURRENT_MODEL_TYPES)}, not in "
            f"{model_type!r} (its padding behaviour is unverified); use sampler.backend=vllm for this model"
        )


def has_recurrent_layers(model: nn.Module) -> bool:
    """Whether ``model`` has linear-attention layers (whose state cannot be padded between tokens)."""
    layer_types = getattr(getattr(model, "config", None), "layer_types", None) or ()
    return "linear_attention" in layer_types


def _kind(layer: object) -> LayerKind:
    # Exact types: a sliding-window layer is a DynamicLayer subclass whose columns cannot be concatenated.
    if type(layer) is DynamicLayer:
        return "attention"
    if type(layer) is LinearAttentionLayer:
        return "recurrent"
    raise SamplerError(
        f"the HF sampler cannot batch a {type(layer).__name__} cache layer (DynamicLayer and "
        "LinearAttentionLayer are supported); use sampler.backend=vllm for this model"
    )


def _states(layer: LinearAttentionLayer) -> tuple[torch.Tensor, torch.Tensor]:
    conv, recurrent = layer.conv_states[0], layer.recurrent_states[0]
    if layer.number_of_states != 1 or conv is None or recurrent is None:
        raise SamplerError("linear-attention cache layers need exactly one conv and one recurrent state")
    return conv, recurrent


def _kv(layer: DynamicLayer) -> tuple[torch.Tensor, torch.Tensor]:
    if layer.keys is None or layer.values is None:
        raise SamplerError("an attention cache layer holds no keys yet")
    return layer.keys, layer.values


def select_rows(cache: DynamicCache, index: torch.Tensor, *, first_column: int) -> None:
    """Keep the rows ``index`` ``(B',)`` of ``cache`` in place, and attention columns from ``first_column``."""
    for layer in cache.layers:
        match _kind(layer):
            case "attention":
                assert isinstance(layer, DynamicLayer)
                keys, values = _kv(layer)
                layer.keys = keys[index, :, first_column:]
                layer.values = values[index, :, first_column:]
            case "recurrent":
                assert isinstance(layer, LinearAttentionLayer)
                conv, recurrent = _states(layer)
                layer.conv_states[0] = conv[index]
                layer.recurrent_states[0] = recurrent[index]
            case unreachable:
                assert_never(unreachable)


def concat_rows(mine: DynamicCache, theirs: DynamicCache, *, width: int) -> None:
    """Append the rows of ``theirs`` to ``mine`` in place; attention columns are left-padded to ``width``."""
    for a, b in zip(mine.layers, theirs.layers, strict=True):
        match _kind(a):
            case "attention":
                assert isinstance(a, DynamicLayer)
                assert isinstance(b, DynamicLayer)
                (keys_a, values_a), (keys_b, values_b) = _kv(a), _kv(b)
                a.keys = torch.cat([pad_left(keys_a, width, dim=2), pad_left(keys_b, width, dim=2)])
                a.values = torch.cat([pad_left(values_a, width, dim=2), pad_left(values_b, width, dim=2)])
            case "recurrent":
                assert isinstance(a, LinearAttentionLayer)
                assert isinstance(b, LinearAttentionLayer)
                (conv_a, rec_a), (conv_b, rec_b) = _states(a), _states(b)
                a.conv_states[0] = torch.cat([conv_a, conv_b])
                a.recurrent_states[0] = torch.cat([rec_a, rec_b])
            case unreachable:
                assert_never(unreachable)


def row_state(cache: DynamicCache, row: int, columns: torch.Tensor) -> tuple[RowState, ...]:
    """Row ``row``'s state per layer, copied out of ``cache``; ``columns`` are its unpadded attention columns."""
    states: list[RowState] = []
    for layer in cache.layers:
        match _kind(layer):
            case "attention":
                assert isinstance(layer, DynamicLayer)
                keys, values = _kv(layer)
                states.append(
                    AttentionRow(
                        keys=keys[row].index_select(1, columns), values=values[row].index_select(1, columns)
                    )
                )
            case "recurrent":
                assert isinstance(layer, LinearAttentionLayer)
                conv, recurrent = _states(layer)
                states.append(RecurrentRow(conv=conv[row].clone(), recurrent=recurrent[row].clone()))
            case unreachable:
                assert_never(unreachable)
    return tuple(states)


def cache_from_rows(
    model: nn.Module, rows: Sequence[tuple[RowState, ...]], *, width: int, device: torch.device
) -> DynamicCache:
    """A cache for ``model`` holding ``rows`` (one tuple of per-layer states each), attention left-padded to
    ``width`` columns; recurrent layers resume from each row's state."""
    cache = DynamicCache(config=getattr(model, "config", None))
    for index, states in enumerate(zip(*rows, strict=True)):
        first = states[0]
        match first:
            case AttentionRow():
                keys = torch.stack([pad_left(_as(s, AttentionRow).keys, width, dim=1) for s in states])
                values = torch.stack([pad_left(_as(s, AttentionRow).values, width, dim=1) for s in states])
                cache.update(keys.to(device), values.to(device), index)
            case RecurrentRow():
                conv = torch.stack([_as(s, RecurrentRow).conv for s in states]).to(device)
                recurrent = torch.stack([_as(s, RecurrentRow).recurrent for s in states]).to(device)
                # The layer's first conv update is its "prefill": it stores the window and marks a previous state.
                cache.update_conv_state(conv, index)
                cache.update_recurrent_state(recurrent, index)
            case unreachable:
                assert_never(unreachable)
    return cache


def _as(state: RowState, kind: type[_Row]) -> _Row:
    if not isinstance(state, kind):
        raise SamplerError(
            f"cached rows disagree on layer kinds: {type(state).__name__}, not {kind.__name__}"
        )
    return state


def pad_left(tensor: torch.Tensor, width: int, *, dim: int = 1) -> torch.Tensor:
    """``tensor`` with zeros prepended along ``dim`` up to ``width``."""
    missing = width - tensor.shape[dim]
    if missing == 0:
        return tensor
    shape = list(tensor.shape)
    shape[dim] = missing
    return torch.cat([tensor.new_zeros(shape), tensor], dim=dim)
