"""Bytes per element and per token of the memory model (`mcprl_train.commands.memory`).

The element sizes: ``w`` of the weights (``model.dtype``), ``m`` of a trainable parameter, its gradient and
AdamW moments (`master_bytes`), ``s`` of the residual stream (`stream_bytes`). The per-token activations a
decoder layer saves for backward (`layer_activation_bytes`, measured term by term on CPU in test_plan.py)
and those saved outside the layers (`model_activation_bytes`).
"""

from __future__ import annotations

from mcprl_policy.config import LoraSettings
from mcprl_train.commands.shape import LayerType, ModelShape
from mcprl_train.config import Config
from mcprl_train.errors import PlanError

__all__ = [
    "DTYPE_BYTES",
    "is_mixed",
    "layer_activation_bytes",
    "master_bytes",
    "model_activation_bytes",
    "stream_bytes",
]

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


def is_mixed(config: Config) -> bool:
    """Whether the policy trains under ``bf16-mixed`` autocast (DeepSpeed's bf16 keeps its own master copy)."""
    return config.model.precision.mixed and config.distributed.backend == "none"


def master_bytes(config: Config) -> int:
    """``m``: bytes per trainable parameter in this process (its gradient and each AdamW moment too)."""
    return 4 if is_mixed(config) else DTYPE_BYTES[config.model.dtype]


def stream_bytes(config: Config, w: int) -> int:
    """``s``: bytes per element of the residual stream: fp32 under a ``bf16-mixed`` full fine-tune (the fp32
    embedding plus bf16 products promotes to fp32), else the weights' ``w`` (a LoRA base is stored in ``w``)."""
    return 4 if is_mixed(config) and config.lora is None else w


def layer_activation_bytes(
    config: Config, shape: ModelShape, w: int, *, device: str, layer_type: LayerType = "full_attention"
) -> int:
    """Bytes one decoder layer saves for backward per token (measured term by term on CPU in test_plan.py).

    Always: each RMSNorm's fp32 input and its per-row rsqrt (``2·(4h + 4)``, and ``4(q + k) + 4(H + H_kv)``
    for Qwen3's q/k norms); the attention kernel's q, k, v and output at ``w`` and its fp32 per-head
    logsumexp (a memory-efficient kernel keeps no ``s²`` scores); the MLP's gate, act(gate) and up (``3·w·i``).
    A trained base adds `_trained_base_bytes` and ``w(q + k)`` for the q/k norms. LoRA leaves those out
    (frozen weights need no inputs) and adds `_lora_bytes`.

    Qwen3.5's output gate adds ``4·w·q`` (measured in fp32 only: in bf16 its fp32 norms keep more). A
    ``linear_attention`` layer (`_gated_delta_net_bytes`) replaces the attention terms with its mixer's; that
    part is an estimate, not a measurement (see there).
    """
    if layer_type == "linear_attention":
        return _gated_delta_net_bytes(config, shape, w, device=device)
    h, i, q, k = shape.hidden_size, shape.intermediate_size, shape.q_dim, shape.kv_dim
    heads, kv_heads = shape.num_heads, shape.num_kv_heads
    qk_norm = shape.qk_norm
    per_token = 2 * (4 * h + 4) + w * (2 * q + 2 * k) + 4 * heads + 3 * w * i
    if qk_norm:
        per_token += 4 * (q + k) + 4 * (heads + kv_heads)
    if shape.attention_output_gate:  # q_proj's doubled output, the gate, its sigmoid, the gated product
        per_token += 4 * w * q
    lora = config.lora
    if lora is None:
        return per_token + _trained_base_bytes(config, shape, w, casts=5) + (w * (q + k) if qk_norm else 0)
    targets = shape.lora_targets(lora.target_modules or ())
    inputs = _lora_saved_inputs(shape, targets, shared=lora.dropout == 0 and not is_mixed(config))
    return per_token + _lora_bytes(
        config, lora, shape, w, inputs=inputs, layer_type=layer_type, device=device
    )


def _gated_delta_net_bytes(config: Config, shape: ModelShape, w: int, *, device: str) -> int:
    """Per token, what a Gated DeltaNet layer saves for backward: an estimate from the inputs of the chunked
    kernel (fla's ``chunk_gated_delta_rule``, which recomputes its intra-chunk matrices in backward): the q/k/v
    projection before and after the causal conv (``2·w·conv_dim``), the gate ``z`` and the mixer's output
    (``2·w·v``), fp32 ``beta`` and decay ``g`` (``8·H_v``); the two RMSNorms and the MLP as in a full-attention
    layer. Not measured: transformers' CPU fallback keeps its per-chunk matrices instead (several times more)."""
    gdn = shape.gated_delta_net
    if gdn is None:
        raise PlanError("a linear_attention layer needs the model's gated_delta_net sizes")
    h, i, v = shape.hidden_size, shape.intermediate_size, gdn.value_dim
    per_token = 2 * (4 * h + 4) + 2 * w * gdn.conv_dim + 2 * w * v + 8 * gdn.num_value_heads + 3 * w * i
    lora = config.lora
    if lora is None:
        return per_token + _trained_base_bytes(config, shape, w, casts=7) + w * v
    inputs = shape.lora_inputs(shape.lora_targets(lora.target_modules or ()), "linear_attention")
    return per_token + _lora_bytes(
        config, lora, shape, w, inputs=inputs, layer_type="linear_attention", device=device
    )


def _trained_base_bytes(config: Config, shape: ModelShape, w: int, *, casts: int) -> int:
    """What a trained base saves beyond a frozen one: the norms' normalised values in the stream's dtype
    (``2·s·h``), the inputs of the linear layers that read the stream (``2·w·h`` when they share one saved
    input per norm, ``casts·w·h`` when autocast casts the fp32 stream separately for each) and down's input
    (``w·i``)."""
    s, h = stream_bytes(config, w), shape.hidden_size
    return 2 * s * h + (2 if s == w else casts) * w * h + w * shape.intermediate_size


def _lora_bytes(
    config: Config,
    lora: LoraSettings,
    shape: ModelShape,
    w: int,
    *,
    inputs: int,
    layer_type: LayerType,
    device: str,
) -> int:
    """LoRA's saved ``inputs`` (elements per token) at ``w``, a dropout mask on them when ``lora.dropout > 0``
    (bool on CUDA's fused kernel, else the dtype of the adapters' input: fp32 under ``bf16-mixed``, where peft
    casts it to the fp32 adapters), and each adapted module's rank-r intermediate at ``w``."""
    mask = 0 if lora.dropout == 0 else 1 if device == "cuda" else master_bytes(config)
    targets = shape.lora_targets(lora.target_modules or ())
    here = [t for t in targets if t in shape.linear_shapes(layer_type)]
    return inputs * (w + mask) + len(here) * lora.r * w


def _lora_saved_inputs(shape: ModelShape, targets: tuple[str, ...], *, shared: bool) -> int:
    """Elements per token of the inputs LoRA's adapters save. Without dropout or a cast the adapters read
    their base layer's input tensor itself: q/k/v share one, gate/up one, and o_proj's is the attention output
    the kernel already keeps; a dropout (or autocast's cast) makes a copy per module."""
    if not shared:
        return shape.lora_inputs(targets)
    h, i = shape.hidden_size, shape.intermediate_size
    attention = h if {"q_proj", "k_proj", "v_proj"} & set(targets) else 0
    mlp = h if {"gate_proj", "up_proj"} & set(targets) else 0
    return attention + mlp + (i if "down_proj" in targets else 0)


def model_activation_bytes(shape: ModelShape, w: int, s: int) -> int:
    """Bytes saved per token outside the layers: token ids, RoPE's cos and sin and the final norm's input and
    normalised value (in the stream's ``s``), its rsqrt, the head's input (``w``)."""
    h = shape.hidden_size
    return 8 + 2 * shape.head_dim * s + (4 * h + 4) + s * h + w * h
