"""The padded training forward equals the packed one."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from mcprl_policy import Layout, Policy, policy_forward


def _vocab_size(policy: Policy) -> int:
    config: Any = policy.model.config
    return int(config.vocab_size)


def test_padded_and_packed_layouts_give_the_same_token_outputs() -> None:
    policy = Policy.from_pretrained("tiny", value_head=True)
    g = torch.Generator().manual_seed(0)
    vocab = _vocab_size(policy)
    seqs: list[list[int]] = [
        torch.randint(10, vocab, (int(n),), generator=g).tolist() for n in (7, 31, 2, 18)
    ]
    with torch.no_grad():
        a = policy_forward(policy, seqs, temperature=0.7, values=True, layout="packed")
        b = policy_forward(policy, seqs, temperature=0.7, values=True, layout="padded")
    assert a.values is not None
    assert b.values is not None
    torch.testing.assert_close(a.logprobs, b.logprobs, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(a.entropies, b.entropies, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(a.values, b.values, atol=1e-5, rtol=1e-5)
    assert torch.equal(a.valid, b.valid)
    assert a.seq_lens == b.seq_lens


@pytest.mark.parametrize("layout", ["packed", "padded"])
def test_ids_outside_the_vocabulary_are_refused_with_the_vocabulary_size(layout: Layout) -> None:
    policy = Policy.from_pretrained("tiny")
    vocab = _vocab_size(policy)
    with pytest.raises(
        ValueError, match=rf"outside the model's vocabulary \(size {vocab}\): \[{vocab + 5}\]"
    ):
        policy_forward(policy, [[1, 2, 3], [4, vocab + 5]], temperature=1.0, values=False, layout=layout)


def test_padded_results_do_not_depend_on_the_logits_chunk_size() -> None:
    policy = Policy.from_pretrained("tiny", value_head=False)
    seqs = [[5, 6, 7, 8, 9], [10, 11], [12, 13, 14]]
    with torch.no_grad():
        whole = policy_forward(policy, seqs, temperature=1.0, values=False, layout="padded")
        policy.logits_chunk_size = 2
        chunked = policy_forward(policy, seqs, temperature=1.0, values=False, layout="padded")
    torch.testing.assert_close(whole.logprobs, chunked.logprobs)
    torch.testing.assert_close(whole.entropies, chunked.entropies)


def _scored_run(
    policy: Policy, seqs: list[list[int]], layout: Layout, needed: torch.Tensor | None, loss_on: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, list[torch.Tensor]]:
    """Logprobs, entropies, valid, and the gradient of Σ(logprob + 0.1·entropy) over the ``loss_on`` tokens."""
    policy.model.zero_grad(set_to_none=True)
    out = policy_forward(policy, seqs, temperature=0.8, values=False, layout=layout, needed=needed)
    (out.logprobs[loss_on].sum() + 0.1 * out.entropies[loss_on].sum()).backward()
    grads = [p.grad.clone() for p in policy.model.parameters() if p.grad is not None]
    return out.logprobs.detach(), out.entropies.detach(), out.valid, grads


@pytest.mark.parametrize("layout", ["packed", "padded"])
def test_scoring_only_the_needed_tokens_gives_their_results_and_the_same_gradient(layout: Layout) -> None:
    policy = Policy.from_pretrained("tiny", value_head=False)
    g = torch.Generator().manual_seed(1)
    vocab = _vocab_size(policy)
    lens = (9, 23, 3, 14)
    seqs: list[list[int]] = [torch.randint(10, vocab, (n,), generator=g).tolist() for n in lens]
    needed = torch.rand(sum(lens), generator=g) < 0.4
    needed[0] = True  # a sequence's first token has no prefix: never scored, even when asked for
    has_prefix = torch.ones(sum(lens), dtype=torch.bool)
    has_prefix[torch.tensor([0, *lens[:-1]]).cumsum(0)] = False
    loss_on = needed & has_prefix
    full_lp, full_ent, full_valid, full_grads = _scored_run(policy, seqs, layout, None, loss_on)
    lp, ent, valid, grads = _scored_run(policy, seqs, layout, needed, loss_on)
    assert torch.equal(full_valid, has_prefix)
    assert torch.equal(valid, loss_on)
    torch.testing.assert_close(lp[valid], full_lp[valid], atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(ent[valid], full_ent[valid], atol=1e-6, rtol=1e-6)
    assert bool((lp[~valid] == 0).all())
    assert bool((ent[~valid] == 0).all())
    assert len(grads) == len(full_grads) > 0
    for got, want in zip(grads, full_grads, strict=True):
        torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize(
    "needed", [torch.ones(5, dtype=torch.bool), torch.ones(7, dtype=torch.float32)], ids=["shape", "dtype"]
)
def test_a_needed_mask_of_the_wrong_shape_or_type_is_refused(needed: torch.Tensor) -> None:
    policy = Policy.from_pretrained("tiny", value_head=False)
    with pytest.raises(ValueError, match=r"needed must be a bool mask of shape \(7,\)"):
        policy_forward(
            policy, [[5, 6, 7], [8, 9, 10, 11]], temperature=1.0, values=False, layout="padded", needed=needed
        )
