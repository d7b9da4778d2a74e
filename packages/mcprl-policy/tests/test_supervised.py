"""The supervised forward: the RL forward's logprobs at the targets, without entropy or recomputation."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch.profiler import ProfilerActivity, profile
from torch.utils.flop_counter import FlopCounterMode

from mcprl_policy import Policy, policy_forward
from mcprl_policy.packed import backbone_and_head
from mcprl_policy.supervised import SupervisedLayout, target_logprobs, target_token_logprobs

LENGTHS = (7, 31, 2, 18, 12)


def _batch(policy: Policy, seed: int = 0, *, shared: int = 0) -> tuple[list[list[int]], list[list[bool]]]:
    """Random sequences of `LENGTHS` (after a common prefix of ``shared`` tokens) and random target masks."""
    config: Any = policy.model.config
    g = torch.Generator().manual_seed(seed)
    prefix = torch.randint(10, int(config.vocab_size), (shared,), generator=g).tolist()
    seqs = [prefix + torch.randint(10, int(config.vocab_size), (n,), generator=g).tolist() for n in LENGTHS]
    masks = [[i > 0 and bool(torch.rand((), generator=g) < 0.4) for i in range(len(q))] for q in seqs]
    masks[1][-1] = True  # at least one target
    return seqs, masks


def _reference_logprobs(policy: Policy, seqs: list[list[int]], masks: list[list[bool]]) -> torch.Tensor:
    """The RL forward's per-token logprobs (every position, with entropies), picked at the targets."""
    out = policy_forward(policy, seqs, temperature=1.0, values=False, layout="padded")
    flags = torch.tensor([f for m in masks for f in m])
    return out.logprobs[flags]


def _grads(policy: Policy, loss: torch.Tensor) -> list[torch.Tensor]:
    params = [p for p in policy.model.parameters() if p.requires_grad]
    return list(torch.autograd.grad(loss, params))


@pytest.mark.parametrize("shared", [0, 12])
@pytest.mark.parametrize("layout", ["packed", "padded", "prefix_grouped"])
@pytest.mark.parametrize("chunk_size", [1024, 3])
def test_target_logprobs_and_their_gradient_equal_the_rl_forwards_at_the_targets(
    layout: SupervisedLayout, chunk_size: int, shared: int
) -> None:
    policy = Policy.from_pretrained("tiny")
    seqs, masks = _batch(policy, shared=shared)
    expected = _reference_logprobs(policy, seqs, masks)
    expected_grads = _grads(policy, -expected.sum())
    policy.logits_chunk_size = chunk_size
    got = target_logprobs(policy, seqs, masks, layout=layout)
    assert got.shape == (sum(sum(m) for m in masks),)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, expected, atol=2e-5, rtol=1e-5)
    for g, e in zip(_grads(policy, -got.sum()), expected_grads, strict=True):
        torch.testing.assert_close(g, e, atol=2e-5, rtol=1e-4)


def test_the_prefix_grouped_layout_runs_a_shared_prefix_once() -> None:
    policy = Policy.from_pretrained("tiny")
    seqs, masks = _batch(policy, shared=12)
    _, head = backbone_and_head(policy.model)

    def backbone_flops(layout: SupervisedLayout) -> int:
        with FlopCounterMode(display=False) as counter:
            target_logprobs(policy, seqs, masks, layout=layout)
        return int(counter.get_total_flops()) - int(
            sum(counter.get_flop_counts().get(type(head).__name__, {}).values())
        )

    # The 12 shared tokens of 5 sequences: 4 of the 5 copies are not run (about 48 of 130 tokens).
    ratio = backbone_flops("prefix_grouped") / backbone_flops("packed")
    assert ratio < 1 - 0.8 * 48 / 130


def _head_flops(policy: Policy, run: Callable[[], torch.Tensor]) -> int:
    """Matmul FLOPs of the output head over the forward and the backward of ``run()``'s sum."""
    _, head = backbone_and_head(policy.model)
    with FlopCounterMode(display=False) as counter:
        run().sum().backward()
    # The head runs outside the backbone, so the counter files it under its own class name at the top level.
    return int(sum(counter.get_flop_counts()[type(head).__name__].values()))


def test_only_the_targets_reach_the_output_head_once_with_nothing_recomputed() -> None:
    policy = Policy.from_pretrained("tiny")
    seqs, masks = _batch(policy)
    _, head = backbone_and_head(policy.model)
    weight: Any = head.weight
    vocab, hidden = int(weight.shape[0]), int(weight.shape[1])
    targets = sum(sum(m) for m in masks)
    positions = sum(n - 1 for n in LENGTHS)
    one_pass = 2 * hidden * vocab  # per row: a (1, H) x (H, V) product
    # forward + backward (input and weight gradients): 3 passes over the target rows.
    assert _head_flops(policy, lambda: target_logprobs(policy, seqs, masks, layout="packed")) == (
        3 * one_pass * targets
    )
    # The RL forward, for contrast: every position (its logits are small enough to be kept for backward).
    assert _head_flops(
        policy, lambda: policy_forward(policy, seqs, temperature=1.0, values=False, layout="packed").logprobs
    ) == (3 * one_pass * positions)


def _vocab_wide_products(run: Callable[[], torch.Tensor], vocab: int) -> int:
    """Elementwise products over a ``(rows, vocab)`` tensor in the forward ``run()``: an entropy's ``p * log p``."""
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        run()
    return sum(
        1
        for e in prof.events() or []
        if e.name == "aten::mul" and any(len(s) == 2 and s[-1] == vocab for s in e.input_shapes)
    )


def test_the_supervised_forward_computes_no_entropy() -> None:
    policy = Policy.from_pretrained("tiny")
    seqs, masks = _batch(policy)
    vocab = policy.vocab_limit
    assert _vocab_wide_products(lambda: target_logprobs(policy, seqs, masks, layout="packed"), vocab) == 0
    rl = _vocab_wide_products(
        lambda: policy_forward(policy, seqs, temperature=1.0, values=False, layout="packed").logprobs, vocab
    )
    assert rl >= 1  # the same probe sees the RL forward's entropy


def test_a_first_token_target_and_a_mask_of_the_wrong_length_are_refused() -> None:
    policy = Policy.from_pretrained("tiny")
    with pytest.raises(ValueError, match="sequence 1: its first token has no prefix"):
        target_logprobs(policy, [[5, 6], [7, 8]], [[False, True], [True, True]], layout="packed")
    with pytest.raises(ValueError, match="sequence 0: a target mask of 3 flags for 2 tokens"):
        target_logprobs(policy, [[5, 6]], [[False, True, True]], layout="padded")
    with pytest.raises(ValueError, match="1 target masks for 2 sequences"):
        target_logprobs(policy, [[5, 6], [7, 8]], [[False, True]], layout="padded")


def test_chunked_and_whole_head_give_logit_minus_log_z_over_the_support() -> None:
    g = torch.Generator().manual_seed(1)
    head = torch.nn.Linear(8, 24, bias=False)
    hidden = torch.randn(11, 8, generator=g)
    targets = torch.randint(0, 24, (11,), generator=g)  # some at or above the limit of 20
    with torch.no_grad():
        logits = head(hidden)
        expected = logits.gather(-1, targets[:, None]).squeeze(-1) - torch.logsumexp(logits[:, :20], -1)
        for chunk_size in (64, 4, 1):
            got = target_token_logprobs(hidden, head, targets, chunk_size=chunk_size, vocab_limit=20)
            torch.testing.assert_close(got, expected)
    with pytest.raises(ValueError, match="chunk_size must be >= 1"):
        target_token_logprobs(hidden, head, targets, chunk_size=0)
