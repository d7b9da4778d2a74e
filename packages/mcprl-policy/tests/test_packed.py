from __future__ import annotations

from pathlib import Path

import pytest
import torch

from mcprl_policy import Policy, pack_sequences
from mcprl_policy.packed import token_logprobs_and_entropy

SEQUENCES = [[1, 5, 9, 33, 7, 2, 8], [4, 4, 100, 250], [12], [12, 13, 14]]


@pytest.fixture(scope="module")
def policy(tiny_dir: Path) -> Policy:
    return Policy.from_pretrained(str(tiny_dir))


def test_pack_sequences_restarts_positions_per_sequence() -> None:
    batch = pack_sequences([[7, 8, 9], [1], [2, 3]])
    assert batch.input_ids.tolist() == [[7, 8, 9, 1, 2, 3]]
    assert batch.position_ids.tolist() == [[0, 1, 2, 0, 0, 1]]
    assert batch.cu_seqlens.tolist() == [0, 3, 4, 6]


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_packed_forward_equals_one_forward_per_sequence(policy: Policy, temperature: float) -> None:
    with torch.no_grad():
        packed = policy.forward_packed(SEQUENCES, temperature=temperature)
        head = policy.value_head
        assert head is not None
        for seq, lp, ent, val, valid in zip(
            SEQUENCES,
            packed.split("logprobs"),
            packed.split("entropies"),
            packed.split("values"),
            packed.split("valid"),
            strict=True,
        ):
            ids = torch.tensor([seq])
            out = policy.model(input_ids=ids, output_hidden_states=True)
            logp = torch.log_softmax(out.logits[0, :-1].float() / temperature, -1)
            expected = logp.gather(-1, ids[0, 1:, None]).squeeze(-1)
            torch.testing.assert_close(lp[1:], expected, atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(ent[1:], -(logp.exp() * logp).sum(-1), atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(val[1:], head(out.hidden_states[-1][0, :-1]), atol=1e-5, rtol=1e-5)
            assert valid.tolist() == [False] + [True] * (len(seq) - 1)
            assert lp[0] == 0
            assert val[0] == 0


def test_chunking_over_tokens_changes_neither_values_nor_gradients(policy: Policy) -> None:
    torch.manual_seed(0)
    hidden = torch.randn(37, policy.hidden_size, requires_grad=True)
    targets = torch.randint(0, 500, (37,))
    head = policy.model.get_output_embeddings()  # pyright: ignore[reportCallIssue]
    results = []
    for chunk in (5, 1024):
        hidden.grad = None
        lp, ent = token_logprobs_and_entropy(hidden, head, targets, temperature=0.9, chunk_size=chunk)
        (lp.sum() + 0.1 * ent.sum()).backward()
        assert hidden.grad is not None
        results.append((lp.detach(), ent.detach(), hidden.grad.clone()))
    for a, b in zip(*results, strict=True):
        torch.testing.assert_close(a, b)


def test_temperature_must_be_positive(policy: Policy) -> None:
    with pytest.raises(ValueError, match="temperature"):
        policy.forward_packed(SEQUENCES, temperature=0.0)
