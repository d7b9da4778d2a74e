"""The padded training forward equals the packed one."""

from __future__ import annotations

import torch

from mcprl_policy import Policy
from mcprl_train.forward import policy_forward


def test_padded_and_packed_layouts_give_the_same_token_outputs() -> None:
    policy = Policy.from_pretrained("tiny", value_head=True)
    g = torch.Generator().manual_seed(0)
    vocab = policy.model.config.vocab_size
    seqs = [torch.randint(10, vocab, (int(n),), generator=g).tolist() for n in (7, 31, 2, 18)]
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
