"""The push's weight stream (`mcprl_policy.weight_push`) on the embedded tiny model, in one process.

The stream under real ZeRO-3 partitions (2 gloo ranks) and into real vLLM engines: mcprl-train's
test_ds_push.py.
"""

from __future__ import annotations

import copy
from collections.abc import Generator, Sequence
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path

import pytest
import torch
from torch import nn

from mcprl_policy import LoraSettings, Policy, SamplerError
from mcprl_policy.weight_push import (
    LOCAL_PARAMETERS,
    merged_lora_weights,
    plan_buckets,
    streamed_weights,
    vllm_name,
)


class RecordingGather:
    """`LOCAL_PARAMETERS` that records which parameters are held full, and when (the bucket sizes, in bytes)."""

    def __init__(self) -> None:
        self.held: set[int] = set()
        self.buckets: list[int] = []

    @property
    def collective(self) -> bool:
        return False

    def full_numel(self, param: nn.Parameter) -> int:
        return param.numel()

    @contextmanager
    def _hold(self, params: Sequence[nn.Parameter]) -> Generator[None]:
        self.buckets.append(sum(p.numel() * p.element_size() for p in params))
        self.held = {id(p) for p in params}
        yield
        self.held = set()

    def gathered(self, params: Sequence[nn.Parameter]) -> AbstractContextManager[object]:
        return self._hold(params)


def _tensor_bytes(model: nn.Module) -> list[int]:
    return [t.numel() * t.element_size() for t in model.state_dict().values()]


def test_the_local_stream_is_the_state_dict_in_order_bit_for_bit(tiny_dir: Path) -> None:
    model = Policy.from_pretrained(str(tiny_dir), value_head=False).model
    expected = list(model.state_dict().items())
    pushed = list(streamed_weights(model, gather=LOCAL_PARAMETERS, bucket_bytes=1))
    assert [n for n, _ in pushed] == [n for n, _ in expected]
    for (_, got), (_, want) in zip(pushed, expected, strict=True):
        assert torch.equal(got, want)


def test_each_tensor_is_read_while_its_bucket_is_held_and_buckets_stay_within_the_budget(
    tiny_dir: Path,
) -> None:
    model = Policy.from_pretrained(str(tiny_dir), value_head=False).model
    params = {name: p for name, p in model.state_dict(keep_vars=True).items() if isinstance(p, nn.Parameter)}
    budget = max(_tensor_bytes(model)) * 3
    gather = RecordingGather()
    for name, _ in streamed_weights(model, gather=gather, bucket_bytes=budget):
        assert id(params[name]) in gather.held, name
    assert len(gather.buckets) > 1
    assert max(gather.buckets) <= budget
    # A tied parameter read twice in one bucket is gathered once, so the buckets sum to at most the state dict.
    assert sum(gather.buckets) <= sum(_tensor_bytes(model))


def test_a_tensor_larger_than_the_budget_is_a_bucket_of_its_own(tiny_dir: Path) -> None:
    model = Policy.from_pretrained(str(tiny_dir), value_head=False).model
    units = [
        (n, t, (t,) if isinstance(t, nn.Parameter) else (), None)
        for n, t in model.state_dict(keep_vars=True).items()
    ]
    largest = max(_tensor_bytes(model))
    buckets = plan_buckets(units, gather=LOCAL_PARAMETERS, bucket_bytes=largest - 1)
    big = [b for b in buckets if any(u[1].numel() * u[1].element_size() == largest for u in b)]
    assert big
    assert all(len(b) == 1 for b in big)
    assert [u[0] for b in buckets for u in b] == [u[0] for u in units]
    with pytest.raises(SamplerError, match="at least one byte, got bucket_bytes=0"):
        plan_buckets(units, gather=LOCAL_PARAMETERS, bucket_bytes=0)


@pytest.mark.parametrize(
    ("peft_name", "expected"),
    [
        (
            "base_model.model.model.layers.0.self_attn.q_proj.base_layer.weight",
            "model.layers.0.self_attn.q_proj.weight",
        ),
        (
            "base_model.model.model.layers.0.self_attn.q_proj.base_layer.bias",
            "model.layers.0.self_attn.q_proj.bias",
        ),
        ("base_model.model.model.norm.weight", "model.norm.weight"),
        ("base_model.model.lm_head.modules_to_save.default.weight", "lm_head.weight"),
        ("base_model.model.lm_head.original_module.weight", None),
        ("base_model.model.model.layers.0.self_attn.q_proj.lora_A.default.weight", None),
        ("base_model.model.model.embed_tokens.lora_embedding_A.default", None),
    ],
)
def test_peft_names_become_the_base_models(peft_name: str, expected: str | None) -> None:
    assert vllm_name(peft_name) == expected


def _lora_policy(tiny_dir: Path) -> Policy:
    policy = Policy.from_pretrained(str(tiny_dir), value_head=False, lora=LoraSettings(r=8, alpha=16))
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in policy.model.named_parameters():
            if "lora_B" in name:  # zero at init: ΔW would be 0 and any merge would pass
                p.add_(torch.randn(p.shape, generator=generator) * 0.05)
    return policy


def test_the_merged_lora_stream_is_peft_merge_and_unload_bit_for_bit(tiny_dir: Path) -> None:
    policy = _lora_policy(tiny_dir)
    before = {n: t.clone() for n, t in policy.model.state_dict().items()}
    gather = RecordingGather()
    pushed = dict(merged_lora_weights(policy.model, gather=gather, bucket_bytes=64 * 1024))
    merged = copy.deepcopy(policy.model).merge_and_unload()  # pyright: ignore[reportCallIssue]
    expected = merged.state_dict()  # pyright: ignore[reportUnknownMemberType, reportUnknownVariableType]
    assert list(pushed) == list(expected)  # pyright: ignore[reportUnknownArgumentType]
    moved = 0
    for name, tensor in pushed.items():
        assert torch.equal(tensor, expected[name]), name
        base = f"base_model.model.{name}".replace(".weight", ".base_layer.weight")
        moved += base in before and not torch.equal(tensor, before[base])
    assert moved > 0  # the adapters' delta is in the pushed weights
    # The policy itself is left as it was (no merge/unmerge round trip on its base weights).
    for name, tensor in policy.model.state_dict().items():
        assert torch.equal(tensor, before[name]), name
    assert len(gather.buckets) > 1


def test_a_merged_push_of_a_model_without_adapters_is_refused(tiny_dir: Path) -> None:
    model = Policy.from_pretrained(str(tiny_dir), value_head=False).model
    with pytest.raises(SamplerError, match="needs a peft model, got"):
        next(merged_lora_weights(model, gather=LOCAL_PARAMETERS, bucket_bytes=1))


def test_a_dora_adapter_is_refused_by_the_merged_push(tiny_dir: Path) -> None:
    policy = _lora_policy(tiny_dir)
    for module in policy.model.modules():
        use_dora = getattr(module, "use_dora", None)
        if isinstance(use_dora, dict):
            use_dora["default"] = True
    with pytest.raises(SamplerError, match="DoRA is not merged by the push"):
        next(merged_lora_weights(policy.model, gather=LOCAL_PARAMETERS, bucket_bytes=1))
