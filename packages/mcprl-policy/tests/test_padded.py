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
