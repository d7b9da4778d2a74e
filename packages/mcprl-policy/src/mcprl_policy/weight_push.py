"""The weights a vLLM engine is pushed, streamed in buckets of bounded size.

A full push hands vLLM ``(name, tensor)`` pairs in the order of ``model.state_dict()``. `streamed_weights` yields
them one bucket at a time: the bucket's parameters are made full (`ParameterGather.gathered`), their pairs are
yielded, and only when the consumer asks for the next pair past the bucket are they released. Where the weights
are already full (one process: `LOCAL_PARAMETERS`) nothing is gathered and the stream is the state dict itself;
under ZeRO-3 (`mcprl_train.parallel.gathered.ZeroParameters`) each bucket is an all-gather, so the transient
of a push is one bucket (``bucket_bytes``, or one tensor larger than that), not the model: TRL pushes the same
way, ``GatheredParameters([param])`` then ``load_weights([(name, param.data)])`` per parameter
(trl/trainer/grpo_trainer.py, ``_move_model_to_vllm``).

The stream goes to vLLM's in-place reload (`mcprl_policy.vllm_engine`), not to TRL's direct
``model.load_weights``: on CPU vLLM packs each linear layer's weight for its GEMM kernel after loading and leaves
an empty ``weight`` behind (``dispatch_cpu_unquantized_gemm``), so a direct load has nothing to write into;
``reload_weights`` puts the layers back in checkpoint format, loads them and repacks. It holds a layer's loaded
tensors until the layer is complete (q, k and v for the fused qkv), so a push's transient is one bucket plus the
unfinished layer's tensors from the bucket before. On CUDA the unquantized weight is used as loaded and both
ways work; one way is kept for both.

A LoRA policy can be pushed merged (`merged_lora_weights`): each LoRA layer's base weight plus its adapter's
``ΔW = scaling · B A`` (peft's ``LoraLayer.get_delta_weight``), computed out of place so the base stays as it was
(peft's ``merge_adapter`` adds the same delta in place and ``unmerge_adapter`` subtracts it, which rounds the
base a little on every push), under the base model's names (TRL's name fixing: no ``base_model.model.`` prefix,
no ``.base_layer``, the adapters' own tensors left out).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import Protocol, cast

import torch
from torch import nn

from mcprl_policy.errors import SamplerError

__all__ = [
    "LOCAL_PARAMETERS",
    "LocalParameters",
    "ParameterGather",
    "merged_lora_weights",
    "plan_buckets",
    "streamed_weights",
    "vllm_name",
]


class ParameterGather(Protocol):
    """How a push makes a model's parameters full for the time it reads them.

    ``collective``: every rank must push at the same point (each bucket is an all-gather), so an engine never
    pushes on its own initiative (a lazy sync before a request), only when told to on every rank.
    """

    @property
    def collective(self) -> bool: ...

    def full_numel(self, param: nn.Parameter) -> int:
        """The parameter's element count at full size."""
        ...

    def gathered(self, params: Sequence[nn.Parameter]) -> AbstractContextManager[object]:
        """Hold ``params`` at full size inside the context (collective when `collective`)."""
        ...


class LocalParameters:
    """Parameters that are full already (one process): nothing to gather."""

    @property
    def collective(self) -> bool:
        return False

    def full_numel(self, param: nn.Parameter) -> int:
        return param.numel()

    def gathered(self, params: Sequence[nn.Parameter]) -> AbstractContextManager[object]:
        del params
        return nullcontext()


LOCAL_PARAMETERS = LocalParameters()

# A unit of the stream: the vLLM name, the tensor it is read from, what must be full to read it, and the LoRA
# layer whose delta is added to it (None: pushed as it is).
_Unit = tuple[str, torch.Tensor, tuple[nn.Parameter, ...], nn.Module | None]


def _nbytes(unit: _Unit, gather: ParameterGather) -> int:
    _, tensor, params, _ = unit
    if not params:
        return tensor.numel() * tensor.element_size()
    return sum(gather.full_numel(p) * p.element_size() for p in params)


def plan_buckets(units: Sequence[_Unit], *, gather: ParameterGather, bucket_bytes: int) -> list[list[_Unit]]:
    """Consecutive units grouped so that each group's full bytes stay within ``bucket_bytes``.

    A unit larger than the budget is a group of its own.

    Raises:
        SamplerError: ``bucket_bytes`` < 1.
    """
    if bucket_bytes < 1:
        raise SamplerError(f"the push's bucket must hold at least one byte, got bucket_bytes={bucket_bytes}")
    buckets: list[list[_Unit]] = []
    current: list[_Unit] = []
    size = 0
    for unit in units:
        n = _nbytes(unit, gather)
        if current and size + n > bucket_bytes:
            buckets.append(current)
            current, size = [], 0
        current.append(unit)
        size += n
    if current:
        buckets.append(current)
    return buckets


def _stream(buckets: list[list[_Unit]], gather: ParameterGather) -> Iterator[tuple[str, torch.Tensor]]:
    for bucket in buckets:
        params = list({id(p): p for _, _, ps, _ in bucket for p in ps}.values())
        with torch.no_grad(), gather.gathered(params):
            for name, tensor, _, layer in bucket:
                weight = tensor.detach()
                if layer is not None:
                    weight = (weight + _delta(layer)).to(weight.dtype)
                yield name, weight


def streamed_weights(
    model: nn.Module, *, gather: ParameterGather, bucket_bytes: int
) -> Iterator[tuple[str, torch.Tensor]]:
    """``model.state_dict()``'s pairs in its order, each bucket's parameters full while it is read.

    A yielded tensor is valid until the stream moves past its bucket (ZeRO-3 then re-partitions it; a consumer
    that keeps a reference keeps that tensor's storage alive, nothing else). Collective when
    ``gather.collective``: every rank must consume the whole stream.
    """
    units: list[_Unit] = []
    for name, tensor in model.state_dict(keep_vars=True).items():
        params = (tensor,) if isinstance(tensor, nn.Parameter) else ()
        units.append((name, tensor, params, None))
    return _stream(plan_buckets(units, gather=gather, bucket_bytes=bucket_bytes), gather)


_PEFT_PREFIX = "base_model.model."


def vllm_name(peft_name: str) -> str | None:
    """A peft model's state-dict name under the base model's naming, or None for an adapter's own tensor.

    ``base_model.model.model.layers.0.self_attn.q_proj.base_layer.weight`` →
    ``model.layers.0.self_attn.q_proj.weight``; ``...modules_to_save.default.weight`` → ``....weight``;
    ``lora_A``/``lora_B``/``lora_embedding_*`` and ``original_module`` copies → None (the PEFT branch of TRL's
    ``_move_model_to_vllm``: the prefix and ``.base_layer`` removed, the adapter's and ``original_module``'s
    tensors skipped, ``_fix_param_name_to_vllm`` with ``modules_to_save.default.``).
    """
    parts = peft_name.removeprefix(_PEFT_PREFIX).split(".")
    if any(p.startswith("lora_") or p == "original_module" for p in parts):
        return None
    return ".".join(parts).replace(".base_layer", "").replace(".modules_to_save.default", "")


def merged_lora_weights(
    model: nn.Module, *, gather: ParameterGather, bucket_bytes: int
) -> Iterator[tuple[str, torch.Tensor]]:
    """A peft LoRA model's weights merged (``W + ΔW`` per LoRA layer), under the base model's names, bucketed.

    ΔW is peft's own ``get_delta_weight`` of the active adapter, added out of place and cast to the base
    weight's dtype (the bits peft's ``merge_adapter`` writes in place). A LoRA layer's base weight, bias and
    adapter matrices are gathered together. Collective when ``gather.collective``.

    Raises:
        SamplerError: ``model`` is not a peft model, or has a LoRA variant this does not merge (DoRA, several
            active adapters, a LoRA embedding).
    """
    from peft.tuners.lora import LoraLayer  # pyright: ignore[reportMissingTypeStubs]

    if not hasattr(model, "peft_config"):
        raise SamplerError(f"a merged LoRA push needs a peft model, got {type(model).__name__}")
    layers: dict[str, nn.Module] = {}
    for name, module in model.named_modules():
        if isinstance(module, LoraLayer) and isinstance(module, nn.Module):
            layers[name] = module
    units: list[_Unit] = []
    for name, tensor in model.state_dict(keep_vars=True).items():
        target = vllm_name(name)
        if target is None:
            continue
        params: tuple[nn.Parameter, ...] = (tensor,) if isinstance(tensor, nn.Parameter) else ()
        owner, _, leaf = name.rpartition(".base_layer.")
        layer = layers.get(owner) if owner else None
        if layer is not None and leaf == "weight":
            units.append((target, tensor, (*params, *_adapter_parameters(layer, owner)), layer))
        else:
            units.append((target, tensor, params, None))
    return _stream(plan_buckets(units, gather=gather, bucket_bytes=bucket_bytes), gather)


def _active_adapter(layer: nn.Module, name: str) -> str:
    adapters = [str(a) for a in getattr(layer, "active_adapters", [])]
    if len(adapters) != 1:
        raise SamplerError(f"{name}: a merged push merges one active adapter, this layer has {adapters}")
    return adapters[0]


def _adapter_parameters(layer: nn.Module, name: str) -> tuple[nn.Parameter, ...]:
    adapter = _active_adapter(layer, name)
    if bool(getattr(layer, "use_dora", {}).get(adapter, False)):
        raise SamplerError(f"{name}: DoRA is not merged by the push (plain LoRA only)")
    lora_a = getattr(layer, "lora_A", None)
    lora_b = getattr(layer, "lora_B", None)
    if (
        not isinstance(lora_a, nn.ModuleDict)
        or not isinstance(lora_b, nn.ModuleDict)
        or adapter not in lora_a
    ):
        raise SamplerError(f"{name}: only LoRA on linear layers is merged by the push")
    return (*lora_a[adapter].parameters(), *lora_b[adapter].parameters())


class _LoraLinear(Protocol):
    def get_delta_weight(self, adapter: str) -> torch.Tensor: ...


def _delta(layer: nn.Module) -> torch.Tensor:
    adapter = _active_adapter(layer, type(layer).__name__)
    return cast(_LoraLinear, layer).get_delta_weight(adapter)
