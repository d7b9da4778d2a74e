"""The warm start's optimizer step: the gradient of the token-mean NLL of the assistant tokens, on either layout."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from mcprl_policy import Policy, policy_forward
from mcprl_train.config import OptimConfig, SFTConfig
from mcprl_train.config.sections import SFTLayout
from mcprl_train.loop.warm_start import SFTExample, SFTStage, sft_layout

LENGTHS = (9, 23, 4, 17, 30, 12)
TRAINED_STEPS = 20  # some turns right, some not (tuned: 12 steps none, 30 all)


def _examples(policy: Policy, *, shared: int = 0) -> list[SFTExample]:
    """Random demonstrations of `LENGTHS` tokens after ``shared`` tokens they all start with (a system prompt)."""
    config: Any = policy.model.config
    g = torch.Generator().manual_seed(0)
    prefix = [int(t) for t in torch.randint(10, int(config.vocab_size), (shared,), generator=g)]
    out: list[SFTExample] = []
    for k in LENGTHS:
        n = shared + k
        ids: list[int] = prefix + [
            int(t) for t in torch.randint(10, int(config.vocab_size), (k,), generator=g)
        ]
        start = int(torch.randint(shared + 1, n - 1, (), generator=g))
        out.append(SFTExample(token_ids=ids, assistant_mask=[int(i >= start) for i in range(n)]))
    return out


def _reference(policy: Policy, examples: list[SFTExample]) -> tuple[float, float, list[torch.Tensor]]:
    """Loss, token accuracy and gradient from the RL forward's logprobs at every position, masked by hand."""
    out = policy_forward(
        policy, [e.token_ids for e in examples], temperature=1.0, values=False, layout="padded"
    )
    mask = torch.tensor([float(m) * (i > 0) for e in examples for i, m in enumerate(e.assistant_mask)])
    total = mask.sum()
    loss = -(out.logprobs * mask).sum() / total
    acc = float(((out.logprobs > torch.log(torch.tensor(0.5))).float() * mask).sum() / total)
    params = [p for p in policy.model.parameters() if p.requires_grad]
    return float(loss), acc, list(torch.autograd.grad(loss, params))


@pytest.mark.parametrize(
    ("layout", "shared"), [("packed", 0), ("padded", 0), ("prefix_grouped", 0), ("prefix_grouped", 10)]
)
def test_an_sft_step_takes_the_gradient_of_the_token_mean_nll_of_the_assistant_tokens(
    layout: SFTLayout, shared: int
) -> None:
    reference = Policy.from_pretrained("tiny")
    policy = Policy.from_pretrained("tiny")
    examples = _examples(policy, shared=shared)
    expected_loss, expected_acc, expected_grads = _reference(reference, examples)
    stage = SFTStage(
        policy=policy,
        sft=SFTConfig(enabled=True, batch_size=len(examples), lr=1e-3, max_grad_norm=1e9, layout=layout),
        optim=OptimConfig(micro_batch_tokens=40 + shared),  # several micro-batches: gradient accumulation
        examples=examples,
        seed=0,
    )
    metrics = stage.train_step()
    assert metrics["sft/loss"] == pytest.approx(expected_loss, rel=1e-5)
    assert metrics["sft/token_acc"] == pytest.approx(expected_acc)
    assert metrics["sft/tokens"] == sum(e.num_targets for e in examples)
    grads = [p.grad for p in policy.model.parameters() if p.requires_grad]
    for got, want in zip(grads, expected_grads, strict=True):
        assert got is not None
        torch.testing.assert_close(got, want, atol=2e-6, rtol=1e-4)


def test_auto_layout_packs_only_where_attention_is_varlen() -> None:
    policy = Policy.from_pretrained("tiny")  # attn_implementation auto: mcprl_varlen_sdpa on CPU
    assert sft_layout("auto", policy) == "packed"
    assert sft_layout("padded", policy) == "padded"
    assert sft_layout("prefix_grouped", policy) == "prefix_grouped"
    # plain SDPA would attend through an N x N block-diagonal mask over a packed row
    assert sft_layout("auto", Policy.from_pretrained("tiny", attn_implementation="sdpa")) == "padded"


def test_the_sft_schedule_decays_the_learning_rate_over_the_stage() -> None:
    policy = Policy.from_pretrained("tiny")
    examples = _examples(policy)
    stage = SFTStage(
        policy=policy,
        sft=SFTConfig(enabled=True, steps=4, batch_size=2, lr=1e-3, scheduler="linear"),
        optim=OptimConfig(),
        examples=examples,
        seed=0,
    )
    lrs = [stage.train_step()["sft/lr"] for _ in range(4)]
    assert lrs == pytest.approx([7.5e-4, 5e-4, 2.5e-4, 0.0])


def _two_turn_examples(policy: Policy) -> list[SFTExample]:
    """Random conversations with two assistant turns (targets) around a span that is not one (a tool reply)."""
    config: Any = policy.model.config
    g = torch.Generator().manual_seed(1)
    out: list[SFTExample] = []
    for k in LENGTHS:
        n = k + 12
        ids = [int(t) for t in torch.randint(10, int(config.vocab_size), (n,), generator=g)]
        mask = [int(3 <= i < 6 or i >= 9) for i in range(n)]
        out.append(SFTExample(token_ids=ids, assistant_mask=mask))
    return out


def test_turn_accuracy_counts_the_assistant_turns_whose_every_token_is_right() -> None:
    policy = Policy.from_pretrained("tiny")
    examples = _two_turn_examples(policy)
    assert [len(e.turn_lengths) for e in examples] == [2] * len(examples)
    stage = SFTStage(
        policy=policy,
        sft=SFTConfig(enabled=True, batch_size=len(examples), lr=1e-2, max_grad_norm=1e9),
        optim=OptimConfig(micro_batch_tokens=40),
        examples=examples,
        seed=0,
    )
    for _ in range(TRAINED_STEPS):
        stage.train_step()
    with torch.no_grad():
        out = policy_forward(
            policy, [e.token_ids for e in examples], temperature=1.0, values=False, layout="padded"
        )
    right = [bool(x) for x in (out.logprobs > torch.log(torch.tensor(0.5))).unbind(0)]
    by_hand: list[bool] = []
    offset = 0
    for e in examples:
        row = right[offset : offset + len(e.token_ids)]
        offset += len(e.token_ids)
        by_hand += [all(row[3:6]), all(row[9:])]
    expected = sum(by_hand) / len(by_hand)
    assert 0 < expected < 1  # some turns learned, some not: the count is not all-or-nothing
    assert stage.train_step()["sft/turn_acc"] == pytest.approx(expected)
