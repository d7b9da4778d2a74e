"""Policy with a value head: HF and vLLM samplers, LoRA, 4-bit, reference policy.

The package imports lazily (PEP 562): ``import mcprl_policy``, its config (`LoraSettings`, `SamplingParams`,
`DType`, `Precision`, `Quantization`), `Completion`, the `PolicySampler` protocol and the errors load neither torch nor
transformers; the model-side names (`Policy`, `HFSampler`, ...) are imported from their modules on first access.
"""

import importlib
from typing import TYPE_CHECKING

from mcprl_policy.completion import Completion, FinishReason
from mcprl_policy.config import (
    AttnImplementation,
    DType,
    LoraSettings,
    Precision,
    PrecisionName,
    Quantization,
    SamplingParams,
)
from mcprl_policy.errors import (
    MissingExtraError,
    ModelLoadError,
    PolicyError,
    SamplerError,
    UnpackableModelError,
)
from mcprl_policy.sampler import PolicySampler

if TYPE_CHECKING:
    from mcprl_policy.chatml_tools import chatml_tool_template
    from mcprl_policy.gguf_convert import convert_gguf
    from mcprl_policy.hf_sampler import HFSampler
    from mcprl_policy.packed import PackedBatch, PackedForward, pack_sequences, packed_forward
    from mcprl_policy.padded import Layout, padded_forward, policy_forward
    from mcprl_policy.pinned_models import PINNED_MODELS, PinnedModel, fetch_pinned_model
    from mcprl_policy.policy import Policy
    from mcprl_policy.reference import ReferencePolicy
    from mcprl_policy.tiny import TINY_PRESETS, TinyPreset, build_tiny_model, mcprl_cache_dir
    from mcprl_policy.value_head import ValueHead

__all__ = [
    "PINNED_MODELS",
    "TINY_PRESETS",
    "AttnImplementation",
    "Completion",
    "DType",
    "FinishReason",
    "HFSampler",
    "Layout",
    "LoraSettings",
    "MissingExtraError",
    "ModelLoadError",
    "PackedBatch",
    "PackedForward",
    "PinnedModel",
    "Policy",
    "PolicyError",
    "PolicySampler",
    "Precision",
    "PrecisionName",
    "Quantization",
    "ReferencePolicy",
    "SamplerError",
    "SamplingParams",
    "TinyPreset",
    "UnpackableModelError",
    "ValueHead",
    "build_tiny_model",
    "chatml_tool_template",
    "convert_gguf",
    "fetch_pinned_model",
    "mcprl_cache_dir",
    "pack_sequences",
    "packed_forward",
    "padded_forward",
    "policy_forward",
]

# The torch/transformers-backed names, each with the module that defines it; the same list as the block above.
_LAZY: dict[str, str] = {
    "HFSampler": "hf_sampler",
    "PackedBatch": "packed",
    "PackedForward": "packed",
    "pack_sequences": "packed",
    "packed_forward": "packed",
    "Layout": "padded",
    "padded_forward": "padded",
    "policy_forward": "padded",
    "PINNED_MODELS": "pinned_models",
    "PinnedModel": "pinned_models",
    "fetch_pinned_model": "pinned_models",
    "chatml_tool_template": "chatml_tools",
    "convert_gguf": "gguf_convert",
    "Policy": "policy",
    "ReferencePolicy": "reference",
    "TINY_PRESETS": "tiny",
    "TinyPreset": "tiny",
    "build_tiny_model": "tiny",
    "mcprl_cache_dir": "tiny",
    "ValueHead": "value_head",
}

if not TYPE_CHECKING:  # hidden from type checkers, so that a misspelt name stays an error there

    def __getattr__(name: str) -> object:
        module = _LAZY.get(name)
        if module is None:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
        globals()[name] = value  # later look-ups are plain module attributes
        return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
