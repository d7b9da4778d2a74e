"""Mixed precision on torch: the autocast context, the trainables' dtype and what a device supports.

A `Precision` (`mcprl_policy.config`) names the compute dtype and whether trainable parameters keep float32
master weights. Under ``bf16-mixed`` every forward of the policy — the learner's, the SFT warm start's, the
reference's and the HF sampler's decode steps — runs inside `autocast`, so the sampler and the learner compute
the same bf16 matrix products from the same float32 weights; backward runs outside it, as torch's AMP recipe
says (``torch.autocast``'s docstring).
"""

from __future__ import annotations

import contextlib
from contextlib import AbstractContextManager

import torch
from torch import nn

from mcprl_policy.config import Precision
from mcprl_policy.errors import PolicyError
from mcprl_policy.loading import torch_dtype

__all__ = ["autocast", "cast_trainable", "check_device"]


def autocast(precision: Precision, device: torch.device) -> AbstractContextManager[object]:
    """``torch.autocast`` to the compute dtype on ``device``'s type under ``bf16-mixed``; otherwise a no-op."""
    if not precision.mixed:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=torch_dtype(precision.dtype))


def cast_trainable(model: nn.Module, precision: Precision) -> None:
    """Store ``model``'s parameters that require a gradient in ``precision.param_dtype`` (in place).

    Frozen parameters (a LoRA or 4-bit base) keep the dtype they were loaded in.
    """
    dtype = torch_dtype(precision.param_dtype)
    with torch.no_grad():
        for param in model.parameters():
            if param.requires_grad and param.is_floating_point() and param.dtype != dtype:
                param.data = param.data.to(dtype)


def check_device(precision: Precision, device: str) -> None:
    """Refuse a compute dtype ``device`` cannot run.

    Raises:
        PolicyError: bfloat16 on a CUDA GPU without bf16 arithmetic (compute capability below 8.0).
    """
    if precision.dtype != "bfloat16" or not device.startswith("cuda") or not torch.cuda.is_available():
        return
    if not torch.cuda.is_bf16_supported(including_emulation=False):
        name = torch.cuda.get_device_name(torch.device(device))
        raise PolicyError(
            f"model dtype bfloat16: {name} has no bf16 arithmetic (CUDA compute capability < 8.0); use "
            "float32 (--set model.dtype=float32), or a GPU of the Ampere generation or later"
        )
