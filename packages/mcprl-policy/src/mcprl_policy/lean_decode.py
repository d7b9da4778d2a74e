"""A lean q_len-1 decode forward for the Llama-family decoder (Llama, Qwen2, Qwen3) over the KV pool.

transformers' forward spends most of a small model's decode step in Python around the arithmetic: decoder-layer
keyword plumbing, the attention-interface lookup, mask preparation, output dataclasses and decorators. This
forward runs the same arithmetic with none of that: it calls the model's own submodules (``embed_tokens``,
``model.rotary_emb``, the norms, ``q_proj``/``k_proj``/``v_proj``/``o_proj``, ``mlp``, ``lm_head``), so peft LoRA
layers, quantized linears and autocast apply exactly as they do in the model's forward, and transcribes the
rest from transformers' ``modeling_qwen3.py`` (``Qwen3Attention.forward``, ``apply_rotary_pos_emb``,
``Qwen3DecoderLayer.forward``) and ``integrations/sdpa_attention.py`` (``sdpa_attention_forward``): the same
rotary formula, the same SDPA call with the same boolean mask (the pool's, handed over as-is, or none), scale and
grouped-query handling (``enable_gqa`` where transformers' ``use_gqa_in_sdpa`` says so, ``repeat_kv`` else).
Keys and values go straight into the pool through its layers' ``update`` (`mcprl_policy.kv_pool.PoolLayer`).

Only models whose forward is exactly that are taken (`lean_unsupported_reason`): the exact classes
``LlamaForCausalLM``, ``Qwen2ForCausalLM``, ``Qwen3ForCausalLM`` (plain or under a non-prompt-learning peft
adapter), every layer full attention, SDPA attention, no hub kernels, no hooks on the modules whose call this
forward replaces. Everything else runs the model's own forward. The logits are the model forward's bits
(``tests/test_lean_decode.py``).
"""

from __future__ import annotations

from typing import Final, Literal, assert_never

import attrs
import torch
import torch.nn.functional as F
from peft import PeftModel
from torch import nn
from transformers import Cache, LlamaForCausalLM, PreTrainedModel, Qwen2ForCausalLM, Qwen3ForCausalLM
from transformers.integrations.sdpa_attention import repeat_kv, use_gqa_in_sdpa

from mcprl_policy.attention import VARLEN_SDPA, decode_sdpa
from mcprl_policy.batch_cache import POOL_ATTENTION, ResolvedLayout
from mcprl_policy.config import DecodeForward
from mcprl_policy.errors import SamplerError
from mcprl_policy.kv_pool import PoolLayer

__all__ = [
    "LEAN_MODEL_TYPES",
    "LeanDecoder",
    "LeanOutput",
    "ResolvedForward",
    "lean_unsupported_reason",
    "resolve_decode_forward",
]

ResolvedForward = Literal["lean", "model"]
"""The decode forward an engine runs (``auto`` resolved)."""

_CLASSES: Final[dict[str, type[PreTrainedModel]]] = {
    "llama": LlamaForCausalLM,
    "qwen2": Qwen2ForCausalLM,
    "qwen3": Qwen3ForCausalLM,
}

LEAN_MODEL_TYPES: Final = frozenset(_CLASSES)
"""``config.model_type`` values whose decoder `LeanDecoder` transcribes."""


def _causal_lm(model: nn.Module) -> nn.Module:
    return model.get_base_model() if isinstance(model, PeftModel) else model


def lean_unsupported_reason(model: nn.Module, kv_layout: ResolvedLayout) -> str | None:
    """Why `LeanDecoder` cannot stand in for ``model``'s forward, or ``None`` when it can."""
    if kv_layout != "pool":
        return f"the lean forward writes into the KV pool, the running cache is {kv_layout!r}"
    if isinstance(model, PeftModel) and model.active_peft_config.is_prompt_learning:
        return "a prompt-learning peft adapter changes the model's inputs"
    lm = _causal_lm(model)
    config = getattr(lm, "config", None)
    model_type = getattr(config, "model_type", None)
    expected = _CLASSES.get(str(model_type))
    if expected is None or type(lm) is not expected:
        return (
            f"{type(lm).__name__} (model_type {model_type!r}) is not one of "
            f"{sorted(c.__name__ for c in _CLASSES.values())}"
        )
    attn = getattr(config, "_attn_implementation", None)
    if attn not in POOL_ATTENTION:  # their q_len-1 decode attention is transformers' `sdpa_attention_forward`
        return f"attention implementation {attn!r} (the lean forward transcribes {sorted(POOL_ATTENTION)})"
    layer_types = set(getattr(config, "layer_types", None) or ["full_attention"])
    if layer_types != {"full_attention"}:
        return f"layer types {sorted(layer_types)} (the lean forward has full attention only)"
    if not getattr(config, "is_causal", True):
        return "the config is not causal"
    if float(getattr(config, "attention_dropout", 0.0)) > 0.0:
        return "attention_dropout > 0"
    if getattr(lm, "use_kernels", False):
        return "hub kernels replace the model's functions (use_kernels)"
    body = getattr(lm, "model", None)
    assert isinstance(body, nn.Module)
    replaced = [("", lm), ("model", body)] + ([] if model is lm else [("the peft wrapper", model)])
    for i, layer in enumerate(getattr(body, "layers", [])):
        assert isinstance(layer, nn.Module)
        replaced += [
            (f"model.layers.{i}", layer),
            (f"model.layers.{i}.self_attn", layer.get_submodule("self_attn")),
        ]
    for name, module in replaced:
        if module._forward_hooks or module._forward_pre_hooks or hasattr(module, "_hf_hook"):
            return f"module {name or type(lm).__name__!r} has hooks, which only its own forward runs"
    return None


def resolve_decode_forward(
    requested: DecodeForward, model: nn.Module, kv_layout: ResolvedLayout
) -> tuple[ResolvedForward, str | None]:
    """The forward an engine decodes with, and why the lean one cannot be (``None``: it can).

    Raises:
        SamplerError: ``lean`` requested for a model `lean_unsupported_reason` refuses, naming the reason.
    """
    reason = lean_unsupported_reason(model, kv_layout)
    match requested:
        case "auto":
            return ("model" if reason else "lean"), reason
        case "lean":
            if reason:
                raise SamplerError(f"decode_forward='lean' is not possible: {reason} (use 'auto' or 'model')")
            return "lean", reason
        case "model":
            return "model", reason
        case unreachable:
            assert_never(unreachable)


@attrs.frozen(kw_only=True, eq=False)
class LeanOutput:
    """The lean forward's result: the last position's logits ``(B, 1, V)``, as ``CausalLMOutputWithPast.logits``."""

    logits: torch.Tensor


@attrs.frozen(kw_only=True, eq=False)
class _Layer:
    input_layernorm: nn.Module
    q_proj: nn.Module
    k_proj: nn.Module
    v_proj: nn.Module
    q_norm: nn.Module | None
    k_norm: nn.Module | None
    o_proj: nn.Module
    post_attention_layernorm: nn.Module
    mlp: nn.Module
    head_dim: int
    groups: int
    scaling: float
    varlen: bool  # the model attends with `VARLEN_SDPA`, whose decode step is `decode_sdpa` where it applies


class LeanDecoder:
    """One decode step (one new token per row) of a Llama-family causal LM, bit for bit its forward's logits.

    Called as the engine's `mcprl_policy.batch_cache.Forward` over a `mcprl_policy.kv_pool.KVPool`.

    Raises:
        SamplerError: the model is not supported (`lean_unsupported_reason`), or it is in training mode when
            called (the engine decodes in eval mode only).
    """

    def __init__(self, model: nn.Module) -> None:
        reason = lean_unsupported_reason(model, "pool")
        if reason:
            raise SamplerError(f"the lean decode forward does not support this model: {reason}")
        self._model = model
        lm = _causal_lm(model)
        body = lm.get_submodule("model")
        self._embed = body.get_submodule("embed_tokens")
        self._rotary = body.get_submodule("rotary_emb")
        self._norm = body.get_submodule("norm")
        self._lm_head = lm.get_submodule("lm_head")
        qk_norm = isinstance(lm, Qwen3ForCausalLM)
        varlen = getattr(lm.config, "_attn_implementation", None) == VARLEN_SDPA
        self._layers: list[_Layer] = []
        for layer in body.get_submodule("layers").children():
            attn = layer.get_submodule("self_attn")
            self._layers.append(
                _Layer(
                    input_layernorm=layer.get_submodule("input_layernorm"),
                    q_proj=attn.get_submodule("q_proj"),
                    k_proj=attn.get_submodule("k_proj"),
                    v_proj=attn.get_submodule("v_proj"),
                    q_norm=attn.get_submodule("q_norm") if qk_norm else None,
                    k_norm=attn.get_submodule("k_norm") if qk_norm else None,
                    o_proj=attn.get_submodule("o_proj"),
                    post_attention_layernorm=layer.get_submodule("post_attention_layernorm"),
                    mlp=layer.get_submodule("mlp"),
                    head_dim=int(_number(attn, "head_dim")),
                    groups=int(_number(attn, "num_key_value_groups")),
                    scaling=_number(attn, "scaling"),
                    varlen=varlen,
                )
            )

    def __call__(
        self,
        *,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None,
        position_ids: torch.Tensor,
        past_key_values: Cache,
    ) -> LeanOutput:
        """Feed ``input_ids`` ``(B, 1)`` at ``position_ids`` ``(B, 1)`` under the pool's boolean ``attention_mask``
        ``(B, 1, 1, W + 1)`` (``None``: no column masked); the last position's logits ``(B, 1, V)``."""
        if self._model.training:
            raise SamplerError("the lean decode forward runs in eval mode only (no dropout)")
        if input_ids.shape[1] != 1:
            raise SamplerError(f"the lean decode forward feeds one token per row, got {input_ids.shape[1]}")
        hidden: torch.Tensor = self._embed(input_ids)
        cos, sin = self._rotary(hidden, position_ids)
        # apply_rotary_pos_emb's unsqueeze_dim=1, done once for every layer.
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        for layer, cache in zip(self._layers, past_key_values.layers, strict=True):
            if not isinstance(cache, PoolLayer):
                raise SamplerError(
                    f"the lean decode forward writes into a KVPool, not a {type(cache).__name__}"
                )
            query, key, value = _projections(layer, hidden, cos, sin)
            attention = _pool_attention(layer, query, key, value, attention_mask, cache)
            hidden = _mlp_block(layer, hidden, attention)
        return LeanOutput(logits=_logits(self._norm, self._lm_head, hidden))


def _number(module: nn.Module, name: str) -> float:
    value = getattr(module, name)
    if not isinstance(value, int | float):
        raise SamplerError(f"{type(module).__name__}.{name} is {value!r}, not a number")
    return value


def _projections(
    layer: _Layer, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The input norm, q/k/v projections, q/k norms (Qwen3) and rotary: ``(B, heads, 1, head_dim)`` each."""
    hidden = layer.input_layernorm(hidden)
    hidden_shape = (*hidden.shape[:-1], -1, layer.head_dim)
    query = layer.q_proj(hidden).view(hidden_shape)
    key = layer.k_proj(hidden).view(hidden_shape)
    if layer.q_norm is not None and layer.k_norm is not None:
        query, key = layer.q_norm(query), layer.k_norm(key)
    query, key = query.transpose(1, 2), key.transpose(1, 2)
    value = layer.v_proj(hidden).view(hidden_shape).transpose(1, 2)
    query = (query * cos) + (_rotate_half(query) * sin)
    key = (key * cos) + (_rotate_half(key) * sin)
    return query, key, value


def _pool_attention(
    layer: _Layer,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    mask: torch.Tensor | None,
    cache: PoolLayer,
) -> torch.Tensor:
    """The pool write and ``sdpa_attention_forward`` at q_len 1: ``(B, 1, heads, head_dim)``."""
    key, value = cache.update(key, value)
    fast = (
        decode_sdpa(query, key, value, mask, scale=layer.scaling, groups=layer.groups)
        if layer.varlen
        else None
    )
    if fast is not None:
        return fast.transpose(1, 2).contiguous()
    gqa = False
    if layer.groups > 1:
        gqa = use_gqa_in_sdpa(mask, key, value)
        if not gqa:
            key, value = repeat_kv(key, layer.groups), repeat_kv(value, layer.groups)
    # q_len 1: transformers' is_causal is False and its dropout 0 outside training.
    out = (
        F.scaled_dot_product_attention(
            query,
            key,
            value,
            attn_mask=mask,
            dropout_p=0.0,
            scale=layer.scaling,
            is_causal=False,
            enable_gqa=True,
        )
        if gqa
        else F.scaled_dot_product_attention(
            query, key, value, attn_mask=mask, dropout_p=0.0, scale=layer.scaling, is_causal=False
        )
    )
    return out.transpose(1, 2).contiguous()


def _mlp_block(layer: _Layer, residual: torch.Tensor, attention: torch.Tensor) -> torch.Tensor:
    """``o_proj``, the residual, the post-attention norm, the MLP and its residual: ``(B, 1, H)``."""
    hidden = residual + layer.o_proj(attention.reshape(*residual.shape[:-1], -1).contiguous())
    return hidden + layer.mlp(layer.post_attention_layernorm(hidden))


def _logits(norm: nn.Module, lm_head: nn.Module, hidden: torch.Tensor) -> torch.Tensor:
    """The final norm and the head at the last position: ``(B, 1, V)``."""
    return lm_head(norm(hidden)[:, -1:, :])


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)
