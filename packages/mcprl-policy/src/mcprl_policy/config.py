"""Configuration values of the policy and its samplers (attrs, frozen, validated)."""

from __future__ import annotations

from typing import Literal

import attrs
from attrs import validators as v

__all__ = [
    "AttnImplementation",
    "DType",
    "DecodeForward",
    "LoraSettings",
    "Precision",
    "PrecisionName",
    "Quantization",
    "SamplingParams",
]

AttnImplementation = Literal["auto", "flash_attention_2", "mcprl_varlen_sdpa", "sdpa", "eager"]
"""Attention kernels: ``auto`` is flash_attention_2 with flash-attn on CUDA, else ``mcprl_varlen_sdpa`` (per-sequence
SDPA for packed rows, plain SDPA otherwise; `mcprl_policy.attention`); the others load as named."""
DType = Literal["float32", "bfloat16", "float16"]
DecodeForward = Literal["auto", "lean", "model"]
"""The HF sampler's decode step: ``lean`` (`mcprl_policy.lean_decode`: Llama/Qwen2/Qwen3 over the KV pool, the model
forward's bits with less Python), the model's own forward, or ``auto`` (lean where the model is supported)."""
Quantization = Literal["nf4", "fp4"]
PrecisionName = Literal["fp32", "bf16-mixed", "bf16-true"]


def _unit_interval(_: object, attribute: attrs.Attribute[float], value: float) -> None:
    if not 0.0 < value <= 1.0:
        raise ValueError(f"{attribute.name} must be in (0, 1], got {value}")


@attrs.frozen(kw_only=True)
class LoraSettings:
    """LoRA adapter settings (Hu et al. 2021, "LoRA: Low-Rank Adaptation of Large Language Models").

    Attributes:
        r: rank of the update.
        alpha: scaling numerator (the update is scaled by ``alpha / r``).
        dropout: dropout on the adapter input.
        target_modules: module names to adapt; ``None`` picks them by architecture (attention and MLP
            projections for Qwen/Llama/Mistral-like models).
    """

    r: int = attrs.field(default=16, validator=v.gt(0))
    alpha: float = attrs.field(default=32.0, validator=v.gt(0.0))
    dropout: float = attrs.field(default=0.0, validator=[v.ge(0.0), v.lt(1.0)])
    target_modules: tuple[str, ...] | None = attrs.field(
        default=None, converter=attrs.converters.optional(tuple)
    )


@attrs.frozen(kw_only=True)
class SamplingParams:
    """How the samplers draw tokens.

    Attributes:
        temperature: softmax temperature; 0 means greedy. Reported logprobs are those of the
            temperature-scaled distribution before top-p/top-k truncation and without the repetition
            penalty (so the trainer, recomputing at the same temperature, starts with ratios of 1); for
            greedy decoding they are the untempered (T = 1) logprobs.
        top_p: nucleus truncation (1.0 = off).
        top_k: keep the k most likely tokens (0 = off).
        repetition_penalty: CTRL-style penalty on already present tokens (1.0 = off).
        stop: stop strings; generation of a row stops once its decoded text contains one (the tokens that
            completed it are kept). The end-of-turn token always stops.
        seed: seed of the sampler's random generator (``None``: nondeterministic).
    """

    temperature: float = attrs.field(default=1.0, validator=v.ge(0.0))
    top_p: float = attrs.field(default=1.0, validator=_unit_interval)
    top_k: int = attrs.field(default=0, validator=v.ge(0))
    repetition_penalty: float = attrs.field(default=1.0, validator=v.gt(0.0))
    stop: tuple[str, ...] = attrs.field(default=(), converter=tuple)
    seed: int | None = None

    @property
    def greedy(self) -> bool:
        """Whether decoding is greedy (temperature 0)."""
        return self.temperature == 0.0

    @property
    def logprob_temperature(self) -> float:
        """The temperature at which sampling logprobs are reported (1 for greedy)."""
        return 1.0 if self.greedy else self.temperature


@attrs.frozen(kw_only=True)
class Precision:
    """How a policy trains in a low-precision dtype: the compute dtype and whether trainables keep fp32.

    ``dtype`` is the compute dtype: what the forward's matrix products run in (under ``torch.autocast``) and
    what frozen weights are stored in (a LoRA base, the reference copy, a 4-bit base's compute dtype, the
    sampling replica, vLLM's weights). ``master_weights`` keeps the trainable parameters, their gradients and
    AdamW's moments in float32 (Micikevicius et al. 2018, "Mixed Precision Training", §3.1): an update of
    ``lr·m/√v`` ≈ 5e-6 is below half a bf16 ulp of any weight above ~2.6e-3 in magnitude, so AdamW applied to
    bf16 parameters in place leaves most of them unchanged.

    The two fields rather than one Lightning-style ``precision`` string, because ``dtype`` is already what
    export, vLLM, quantization and ``plan`` read as "the model's dtype"; the Lightning names map one to one
    (`name`): ``float32`` → ``fp32``; ``bfloat16`` → ``bf16-mixed`` (default) or, with
    ``master_weights=False``, ``bf16-true`` (everything in bf16, for memory at the cost of lost updates).

    Raises:
        ValueError: ``float16``: fp16 training needs dynamic loss scaling (a ``GradScaler``), which mcprl does
            not implement; bf16 has fp32's exponent range and needs none.
    """

    dtype: DType = "float32"
    master_weights: bool = True

    def __attrs_post_init__(self) -> None:
        if self.dtype == "float16":
            raise ValueError(
                "dtype float16: fp16 training needs dynamic loss scaling (a GradScaler), which mcprl does not "
                "implement; use bfloat16 (CUDA compute capability >= 8.0, or CPU) or float32"
            )

    @property
    def name(self) -> PrecisionName:
        """The Lightning name of this precision: ``fp32``, ``bf16-mixed`` or ``bf16-true``."""
        match self.dtype:
            case "float32":
                return "fp32"
            case "bfloat16":
                return "bf16-mixed" if self.master_weights else "bf16-true"
            case "float16":
                raise AssertionError("refused in __attrs_post_init__")

    @property
    def mixed(self) -> bool:
        """Whether forwards run under autocast over float32 trainable parameters."""
        return self.name == "bf16-mixed"

    @property
    def param_dtype(self) -> DType:
        """The dtype of trainable parameters (and so of their gradients and optimizer state)."""
        return "float32" if self.mixed else self.dtype
