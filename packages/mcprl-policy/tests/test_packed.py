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


def _head_calls_and_results(
    hidden: torch.Tensor,
    head: torch.nn.Module,
    targets: torch.Tensor,
    *,
    chunk: int,
    keep: int,
    entropy: float,
) -> tuple[int, list[torch.Tensor]]:
    """Head forwards counted over one forward + backward, and (logprobs, entropies, both gradients)."""
    calls = 0

    def count(*_: object) -> None:
        nonlocal calls
        calls += 1

    hook = head.register_forward_hook(count)
    try:
        hidden.grad = None
        head.zero_grad(set_to_none=True)
        lp, ent = token_logprobs_and_entropy(
            hidden, head, targets, temperature=0.9, chunk_size=chunk, vocab_limit=400, keep_logits_bytes=keep
        )
        (lp.sum() + entropy * ent.sum()).backward()
    finally:
        hook.remove()
    weight = next(head.parameters())
    assert hidden.grad is not None
    assert weight.grad is not None
    return calls, [lp.detach(), ent.detach(), hidden.grad.clone(), weight.grad.clone()]


@pytest.mark.parametrize("entropy", [0.0, 0.1])
@pytest.mark.parametrize("chunk", [5, 1024])
def test_kept_logits_give_the_checkpointed_results_and_gradients_bit_for_bit(
    policy: Policy, chunk: int, entropy: float
) -> None:
    torch.manual_seed(0)
    hidden = torch.randn(37, policy.hidden_size, requires_grad=True)
    targets = torch.randint(0, 500, (37,))
    head = policy.model.get_output_embeddings()  # pyright: ignore[reportCallIssue]
    chunks = -(-37 // chunk)
    recomputed_calls, recomputed = _head_calls_and_results(
        hidden, head, targets, chunk=chunk, keep=0, entropy=entropy
    )
    kept_calls, kept = _head_calls_and_results(
        hidden, head, targets, chunk=chunk, keep=1 << 30, entropy=entropy
    )
    assert (recomputed_calls, kept_calls) == (2 * chunks, chunks)
    for a, b in zip(recomputed, kept, strict=True):
        assert torch.equal(a, b)


def test_logits_are_recomputed_exactly_when_a_full_chunk_exceeds_the_budget(policy: Policy) -> None:
    hidden = torch.randn(10, policy.hidden_size, requires_grad=True)
    targets = torch.randint(0, 500, (10,))
    head = policy.model.get_output_embeddings()  # pyright: ignore[reportCallIssue]
    size = 16 * int(head.out_features) * 4
    assert _head_calls_and_results(hidden, head, targets, chunk=16, keep=size, entropy=0.0)[0] == 1
    assert _head_calls_and_results(hidden, head, targets, chunk=16, keep=size - 1, entropy=0.0)[0] == 2
    # The chunk size decides, not the rows at hand (10 < 16): every rank calls the head equally often.
    assert _head_calls_and_results(hidden, head, targets, chunk=16, keep=10 * size // 16, entropy=0.0)[0] == 2
    # A head whose output width is unknown is always recomputed: its logits' size cannot be bounded.
    wrapped = torch.nn.Sequential(head)
    assert _head_calls_and_results(hidden, wrapped, targets, chunk=1024, keep=1 << 30, entropy=0.0)[0] == 2
    with pytest.raises(ValueError, match="keep_logits_bytes"):
        token_logprobs_and_entropy(hidden, head, targets, keep_logits_bytes=-1)
