"""Policy with a value head: HF and vLLM samplers, LoRA, 4-bit, reference policy."""

from mcprl_policy.completion import Completion, FinishReason
from mcprl_policy.config import DType, LoraSettings, Quantization, SamplingParams
from mcprl_policy.errors import MissingExtraError, ModelLoadError, PolicyError, SamplerError
from mcprl_policy.hf_sampler import HFSampler
from mcprl_policy.packed import PackedBatch, PackedForward, pack_sequences, packed_forward
from mcprl_policy.padded import Layout, padded_forward, policy_forward
from mcprl_policy.policy import Policy
from mcprl_policy.reference import ReferencePolicy
from mcprl_policy.sampler import PolicySampler
from mcprl_policy.tiny import TINY_PRESETS, TinyPreset, build_tiny_model, mcprl_cache_dir
from mcprl_policy.value_head import ValueHead

__all__ = [
    "TINY_PRESETS",
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
    "Policy",
    "PolicyError",
    "PolicySampler",
    "Quantization",
    "ReferencePolicy",
    "SamplerError",
    "SamplingParams",
    "TinyPreset",
    "ValueHead",
    "build_tiny_model",
    "mcprl_cache_dir",
    "pack_sequences",
    "packed_forward",
    "padded_forward",
    "policy_forward",
]
