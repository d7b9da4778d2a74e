"""LoRA adapters via peft, with target modules chosen by architecture."""

from __future__ import annotations

from typing import Final

from torch import nn

from mcprl_policy.config import LoraSettings
from mcprl_policy.errors import PolicyError

__all__ = ["apply_lora", "lora_target_modules"]

_ATTN_MLP: Final = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")

# Qwen3.5's linear-attention layers (``Qwen3_5GatedDeltaNet``): the q/k/v input projection, the output gate's
# projection, the delta rule's beta and decay projections, and the output projection. Every linear layer of the
# decoder is adapted, as peft's "all-linear" would. vLLM's Qwen3.5 maps these names (in_proj_qkv and in_proj_z
# kept unfused when LoRA is enabled, in_proj_b and in_proj_a packed as in_proj_ba).
_GATED_DELTA_NET: Final = ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a", "out_proj")

# Decoder families whose attention and MLP projections carry these names.
_TARGETS_BY_MODEL_TYPE: Final[dict[str, tuple[str, ...]]] = {
    name: _ATTN_MLP
    for name in (
        "qwen2",
        "qwen3",
        "qwen2_moe",
        "qwen3_moe",
        "llama",
        "mistral",
        "mixtral",
        "gemma",
        "gemma2",
        "gemma3_text",
        "phi3",
        "olmo",
        "olmo2",
        "granite",
        "smollm3",
    )
}
# Hybrid decoders: full-attention and MLP projections plus those of their linear-attention layers.
_TARGETS_BY_MODEL_TYPE.update(dict.fromkeys(("qwen3_5", "qwen3_5_text"), (*_ATTN_MLP, *_GATED_DELTA_NET)))


def lora_target_modules(model_type: str, settings: LoraSettings) -> tuple[str, ...]:
    """The module names LoRA adapts for a model of ``model_type`` (``settings.target_modules`` wins)."""
    if settings.target_modules is not None:
        return settings.target_modules
    try:
        return _TARGETS_BY_MODEL_TYPE[model_type]
    except KeyError:
        known = ", ".join(sorted(_TARGETS_BY_MODEL_TYPE))
        raise PolicyError(
            f"no default LoRA target modules for model type {model_type!r} (known: {known}); "
            "set LoraSettings(target_modules=(...)) to the names of its linear layers"
        ) from None


def apply_lora(model: nn.Module, settings: LoraSettings) -> nn.Module:
    """Wrap ``model`` in a peft LoRA model; only adapter weights stay trainable.

    Returns:
        The ``PeftModel``; ``model.disable_adapter()`` gives the base model back (the reference policy).
    """
    from peft import LoraConfig, get_peft_model

    model_type = str(getattr(getattr(model, "config", None), "model_type", ""))
    config = LoraConfig(
        r=settings.r,
        lora_alpha=settings.alpha,  # pyright: ignore[reportArgumentType]
        lora_dropout=settings.dropout,
        target_modules=list(lora_target_modules(model_type, settings)),
        bias="none",
        task_type="CAUSAL_LM",
    )
    return get_peft_model(model, config)  # pyright: ignore[reportArgumentType]
