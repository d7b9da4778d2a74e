"""Compiled decoder layers (`mcprl_policy.compiled`): the eager forward's logprobs and gradients within float
tolerance, swapped in only inside ``active``, and clear errors where inductor cannot compile."""

from __future__ import annotations

import copy
from contextlib import nullcontext
from typing import Any

import pytest
import torch
from torch import nn
from torch._dynamo.utils import counters
from transformers import GPT2Config, GPT2LMHeadModel

from mcprl_policy import LoraSettings, MissingExtraError, Policy, policy_forward
from mcprl_policy.compiled import CompiledLayers, compile_unavailable_reason

# Inductor fuses the elementwise work, so sums are taken in another order: float32 rounding, no more.
ATOL, RTOL = 1e-5, 1e-4


def _layers(model: nn.Module) -> list[nn.Module]:
    layers = model.get_submodule("model.layers")
    assert isinstance(layers, nn.ModuleList)
    return list(layers)


def _sequences(policy: Policy) -> list[list[int]]:
    config: Any = policy.model.config
    vocab = int(config.vocab_size)
    g = torch.Generator().manual_seed(0)
    return [torch.randint(5, vocab, (n,), generator=g).tolist() for n in (9, 23, 2, 17, 40)]


def _forward_and_grads(
    policy: Policy, sequences: list[list[int]], compiled: CompiledLayers | None
) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
    """The padded layout's forward (the packed one's per-sequence attention recompiles per set of lengths)."""
    policy.model.zero_grad(set_to_none=True)
    with compiled.active() if compiled is not None else nullcontext():
        out = policy_forward(policy, sequences, temperature=0.9, values=False, layout="padded")
    (out.logprobs.sum() + 0.1 * out.entropies.sum()).backward()
    grads = [p.grad.clone() for p in policy.trainable_parameters() if p.grad is not None]
    return out.logprobs.detach(), out.entropies.detach(), grads


@pytest.mark.parametrize("lora", [False, pytest.param(True, marks=pytest.mark.slow)], ids=["full", "lora"])
def test_compiled_layers_give_the_eager_logprobs_and_gradients_within_tolerance(lora: bool) -> None:
    torch.manual_seed(0)
    policy = Policy.from_pretrained("tiny-8h", value_head=False, lora=LoraSettings(r=4) if lora else None)
    policy.model.train()
    sequences = _sequences(policy)
    eager = _forward_and_grads(policy, sequences, None)
    compiled = CompiledLayers(policy.model)
    counters.clear()
    result = _forward_and_grads(policy, sequences, compiled)
    assert counters["stats"]["unique_graphs"] >= 1  # the compiled layers ran, not the plain ones
    torch.testing.assert_close(result[0], eager[0], atol=ATOL, rtol=RTOL)
    torch.testing.assert_close(result[1], eager[1], atol=ATOL, rtol=RTOL)
    assert len(result[2]) == len(eager[2]) > 0
    for got, want in zip(result[2], eager[2], strict=True):
        torch.testing.assert_close(got, want, atol=ATOL * float(want.abs().max()), rtol=RTOL)


def test_outside_active_the_model_holds_its_plain_layers() -> None:
    policy = Policy.from_pretrained("tiny-8h", value_head=False)
    model = policy.model
    layers = _layers(model)
    keys = list(model.state_dict())
    compiled = CompiledLayers(model)
    with compiled.active():
        inside = _layers(model)
        assert all(a is not b for a, b in zip(inside, layers, strict=True))
        assert all(getattr(a, "_orig_mod", None) is b for a, b in zip(inside, layers, strict=True))
    assert all(a is b for a, b in zip(_layers(model), layers, strict=True))
    assert list(model.state_dict()) == keys
    assert list(copy.deepcopy(model).state_dict()) == keys
    with pytest.raises(RuntimeError, match="boom"), compiled.active():
        raise RuntimeError("boom")
    assert all(a is b for a, b in zip(_layers(model), layers, strict=True))


def test_without_a_cxx_compiler_compile_is_refused_naming_what_to_install() -> None:
    from torch._inductor import config

    policy = Policy.from_pretrained("tiny-8h", value_head=False)
    with config.patch({"cpp.cxx": ("/nonexistent/bin/c++",)}):
        assert "no C++ compiler" in str(compile_unavailable_reason(torch.device("cpu")))
        with pytest.raises(MissingExtraError, match=r"no C\+\+ compiler.*apt-get install g\+\+"):
            CompiledLayers(policy.model)
    assert compile_unavailable_reason(torch.device("cpu")) is None


def test_a_device_other_than_cpu_and_cuda_is_refused() -> None:
    assert compile_unavailable_reason(torch.device("mps")) == (
        "torch.compile is wired for cpu and cuda, not 'mps': leave compile off"
    )


def test_a_backbone_without_a_layers_list_is_refused() -> None:
    model: nn.Module = GPT2LMHeadModel(
        GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=50, n_positions=32)
    )
    with pytest.raises(TypeError, match="GPT2Model keeps none in a 'layers' ModuleList: leave compile off"):
        CompiledLayers(model)


@pytest.mark.gpu
def test_on_cuda_compiled_layers_give_the_eager_logprobs_and_gradients_within_tolerance() -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    torch.manual_seed(0)
    policy = Policy.from_pretrained("tiny-8h", value_head=False, device="cuda")
    policy.model.train()
    sequences = _sequences(policy)
    eager = _forward_and_grads(policy, sequences, None)
    result = _forward_and_grads(policy, sequences, CompiledLayers(policy.model))
    torch.testing.assert_close(result[0], eager[0], atol=ATOL, rtol=RTOL)
    for got, want in zip(result[2], eager[2], strict=True):
        torch.testing.assert_close(got, want, atol=ATOL * float(want.abs().max()), rtol=RTOL)
