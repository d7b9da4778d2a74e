"""``optim.compile``: the update with compiled decoder layers (`mcprl_policy.compiled`) against the eager update,
and the configurations it is refused in."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from torch._dynamo.utils import counters
from train_testkit import synthetic_groups

from mcprl_policy import Policy
from mcprl_train.config import Config, OptimConfig
from mcprl_train.errors import ConfigError
from mcprl_train.loop.learner import Learner
from mcprl_train.loop.update import TorchBackend
from mcprl_train.typed_torch import manual_seed


def _update(template: Policy, *overrides: str) -> tuple[list[torch.Tensor], dict[str, float]]:
    policy = copy.deepcopy(template)
    config = Config.load(
        "cpu",
        overrides=[
            "optim.lr=1e-3",
            "optim.warmup_steps=0",
            "optim.micro_batch_tokens=64",
            "optim.layout=padded",
            *overrides,
        ],
    )
    learner = Learner(policy=policy, config=config, total_steps=10, seed=0)
    samples, _ = learner.prepare(synthetic_groups(policy))
    metrics = learner.update(samples)
    return [p.detach().clone() for p in policy.trainable_parameters()], metrics


@pytest.fixture(scope="module")
def template() -> Policy:
    manual_seed(0)
    return Policy.from_pretrained("tiny", value_head=False)


def _gradients(template: Policy, optim: OptimConfig) -> tuple[torch.Tensor, list[torch.Tensor]]:
    policy = copy.deepcopy(template)
    backend = TorchBackend(policy, optim)
    sequences = [[5 + (7 * i + 3 * j) % 600 for j in range(n)] for i, n in enumerate((40, 9, 77, 23, 2))]
    out = backend.forward(sequences, temperature=1.0, values=False)
    backend.backward(out.logprobs.sum() + 0.01 * out.entropies.sum())
    # After the forward the model holds its plain layers again (the autograd graph keeps the compiled ones).
    layers = policy.model.get_submodule("model.layers")
    assert isinstance(layers, torch.nn.ModuleList)
    assert not any(hasattr(m, "_orig_mod") for m in layers)
    return out.logprobs.detach(), [p.grad for p in backend.params if p.grad is not None]


def test_the_backends_compiled_forward_and_gradients_are_the_eagers_within_float_tolerance(
    template: Policy,
) -> None:
    eager_logprobs, eager = _gradients(template, OptimConfig(layout="padded"))
    counters.clear()
    logprobs, compiled = _gradients(template, OptimConfig(layout="padded", compile=True))
    assert counters["stats"]["unique_graphs"] >= 1  # the compiled layers ran
    torch.testing.assert_close(logprobs, eager_logprobs, atol=1e-5, rtol=1e-4)
    assert len(compiled) == len(eager) > 0
    for got, want in zip(compiled, eager, strict=True):
        torch.testing.assert_close(got, want, atol=1e-5 * float(want.abs().max()), rtol=1e-4)


def test_an_update_with_compiled_layers_is_the_eager_update_within_float_tolerance(template: Policy) -> None:
    eager_params, eager = _update(template)
    compiled_params, compiled = _update(template, "optim.compile=true")
    assert eager.keys() == compiled.keys()
    for key in ("loss/policy", "optim/grad_norm", "ratio/mean", "loss/entropy"):
        assert math.isclose(compiled[key], eager[key], rel_tol=1e-4, abs_tol=1e-6), key
    before = list(template.trainable_parameters())
    assert sum(not torch.equal(a, b) for a, b in zip(before, eager_params, strict=True)) > len(before) // 2
    # AdamW's first step moves each weight by lr · g / (|g| + eps), a step function of the gradient g: where g is
    # within float rounding of zero, rounding alone turns that step by up to 2 · lr (the gradients themselves are
    # held tight by the test above). So every weight agrees within 2 · lr, and all but a few in a thousand of
    # the model's weights agree to float rounding; counted over the whole model, not per tensor, where one such
    # weight in a 128-element norm would be 1/128 of it.
    moved = 0
    for got, want in zip(compiled_params, eager_params, strict=True):
        torch.testing.assert_close(got, want, atol=2e-3, rtol=0.0)
        moved += int(((got - want).abs() > 1e-6).sum())
    total = sum(p.numel() for p in eager_params)
    assert moved < 1e-3 * total, (moved, total)


def test_compile_with_the_packed_layout_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"optim\.compile: true needs optim\.layout=padded"):
        Config.load("cpu", overrides=["optim.layout=packed", "optim.compile=true"])


def test_compile_with_deepspeed_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"optim\.compile: true with distributed\.backend=deepspeed"):
        Config.load("a100x2", overrides=["optim.layout=padded", "optim.compile=true"])
