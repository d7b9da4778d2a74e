"""The value head: a scalar per token on the backbone's last hidden state (PPO / GAE critic)."""

from __future__ import annotations

from pathlib import Path
from typing import Final

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from mcprl_policy.errors import ModelLoadError

__all__ = ["VALUE_HEAD_FILE", "ValueHead"]

VALUE_HEAD_FILE: Final = "value_head.safetensors"


class ValueHead(nn.Module):
    """``Linear(hidden_size, 1)`` in float32 on the last hidden state.

    Args:
        hidden_size: width of the backbone's hidden state.
        seed: seed of the initialisation (the head is deterministic for a given seed).
    """

    def __init__(self, hidden_size: int, *, seed: int = 0) -> None:
        super().__init__()
        self.hidden_size = hidden_size
        self.linear = nn.Linear(hidden_size, 1, dtype=torch.float32)
        generator = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            # Small weights, zero bias: initial values near 0 whatever the backbone's scale.
            self.linear.weight.copy_(torch.randn(1, hidden_size, generator=generator) / hidden_size)
            self.linear.bias.zero_()

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """Values of hidden states ``(..., H)`` → ``(...)``, computed in float32."""
        weight = self.linear.weight
        return self.linear(hidden.to(weight.dtype)).squeeze(-1)

    def save(self, directory: Path) -> Path:
        """Write the head as ``value_head.safetensors`` in ``directory``; returns the file."""
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / VALUE_HEAD_FILE
        tensors = {k: t.detach().to("cpu").contiguous() for k, t in self.state_dict().items()}
        save_file(tensors, str(path), metadata={"hidden_size": str(self.hidden_size)})
        return path

    @classmethod
    def load(cls, directory: Path, *, hidden_size: int) -> ValueHead:
        """Read a head written by `save`; the hidden size must match the backbone's."""
        path = directory / VALUE_HEAD_FILE
        tensors = load_file(str(path))
        width = tensors["linear.weight"].shape[-1]
        if width != hidden_size:
            raise ModelLoadError(
                f"value head in {path} has width {width}, the model's hidden size is {hidden_size}"
            )
        head = cls(hidden_size)
        head.load_state_dict(tensors)
        return head
