"""4-bit base weights via bitsandbytes (QLoRA, Dettmers et al. 2023) — the only module importing it.

bitsandbytes is an optional dependency (extra ``qlora``); without it, asking for 4-bit raises
`MissingExtraError` with the install command.
"""

from __future__ import annotations

from typing import Any

import torch

from mcprl_policy.config import Quantization
from mcprl_policy.errors import MissingExtraError

__all__ = ["four_bit_config", "require_bitsandbytes"]

_HINT = "4-bit (QLoRA) needs bitsandbytes: `uv sync --extra qlora` or `pip install 'mcprl-policy[qlora]'`"


def require_bitsandbytes() -> Any:
    """Import bitsandbytes or raise `MissingExtraError` naming the install command."""
    try:
        import bitsandbytes
    except ImportError as exc:
        raise MissingExtraError(f"{_HINT} ({exc})") from exc
    return bitsandbytes


def four_bit_config(kind: Quantization, *, compute_dtype: torch.dtype) -> Any:
    """A transformers ``BitsAndBytesConfig`` loading linear weights in 4 bits (``nf4`` or ``fp4``)."""
    require_bitsandbytes()
    from transformers import BitsAndBytesConfig

    return BitsAndBytesConfig(
        load_in_4bit=True,
        bnb_4bit_quant_type=kind,
        bnb_4bit_compute_dtype=compute_dtype,
        bnb_4bit_use_double_quant=True,
    )
