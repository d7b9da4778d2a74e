"""``torch.compile`` (inductor) of a causal LM's decoder layers for the training forward, with a clear error where
it cannot run.

Regional compilation (torch's recipe for transformer stacks): each decoder layer is compiled, with dynamic shapes,
and the layers share one graph (they run the same code over parameters of the same shapes), so compile time does
not grow with depth. Inductor fuses the elementwise work (RMSNorm, rotary, SiLU, residuals, their backward) into
fewer kernels: C++/OpenMP on CPU (it needs a C++ compiler at run time), Triton on CUDA (it needs ``triton``). Its
floats are not the eager path's bits; ``tests/test_compiled.py`` holds it to the eager forward and gradients
within a tolerance.

The compiled layers are swapped into the model only inside `CompiledLayers.active`, so everything else that runs
the same model (the sampler's prefill, the warm start's packed forward with its per-sequence attention, a
snapshot's deep copy) runs and copies the plain layers.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from contextlib import contextmanager
from typing import cast

import torch
from torch import nn

from mcprl_policy.errors import MissingExtraError
from mcprl_policy.packed import backbone_and_head

__all__ = ["CompiledLayers", "compile_unavailable_reason"]


def compile_unavailable_reason(device: torch.device) -> str | None:
    """Why inductor cannot compile for ``device`` here, naming what to install, or ``None`` when it can."""
    match device.type:
        case "cpu":
            from torch._inductor import exc
            from torch._inductor.cpp_builder import get_cpp_compiler

            try:
                get_cpp_compiler()
            except (exc.InvalidCxxCompiler, RuntimeError) as error:
                return (
                    f"torch.compile on CPU builds C++ kernels and found no C++ compiler ({error}): install one "
                    "(apt-get install g++, or point CXX at one) or leave compile off"
                )
            return None
        case "cuda":
            if importlib.util.find_spec("triton") is None:
                return (
                    "torch.compile on CUDA generates Triton kernels: pip install triton, or leave compile off"
                )
            return None
        case other:
            return f"torch.compile is wired for cpu and cuda, not {other!r}: leave compile off"


class CompiledLayers:
    """A causal LM's decoder layers (``<backbone>.layers``), compiled, swapped in by `active`.

    Args:
        model: a causal LM, plain or peft-wrapped, whose backbone keeps its decoder layers in a ``layers``
            ``ModuleList`` (Llama, Qwen2/3, Mistral, Gemma and most of transformers' decoders).

    Raises:
        MissingExtraError: inductor cannot compile for the model's device here (`compile_unavailable_reason`).
        TypeError: the model's backbone has no ``layers`` ``ModuleList``.
    """

    def __init__(self, model: nn.Module) -> None:
        reason = compile_unavailable_reason(next(model.parameters()).device)
        if reason is not None:
            raise MissingExtraError(reason)
        backbone, _ = backbone_and_head(model)
        layers = getattr(backbone, "layers", None)
        if not isinstance(layers, nn.ModuleList) or not len(layers):
            raise TypeError(
                f"compile swaps in compiled decoder layers and {type(backbone).__name__} keeps none in a "
                "'layers' ModuleList: leave compile off for this model"
            )
        self._layers = layers
        self._plain = list(layers)
        self._compiled = [cast("nn.Module", torch.compile(layer, dynamic=True)) for layer in self._plain]

    @contextmanager
    def active(self) -> Iterator[None]:
        """Run the model with the compiled layers inside the block (a forward's graph keeps them for backward)."""
        for i, layer in enumerate(self._compiled):
            self._layers[i] = layer
        try:
            yield
        finally:
            for i, layer in enumerate(self._plain):
                self._layers[i] = layer
