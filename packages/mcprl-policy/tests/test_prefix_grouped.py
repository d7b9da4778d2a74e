"""The prefix-grouped training forward: the groups it finds, the micro-batches it fills, and its results and
gradients against the padded forward, which runs every sequence whole."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from peft import LoraConfig, get_peft_model
from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

from mcprl_policy import Policy, UnpackableModelError, policy_forward
from mcprl_policy.prefix_grouped import (
    PrefixGroup,
    computed_tokens,
    length_buckets,
    pack_prefix_groups,
    prefix_grouped_forward,
    prefix_groups,
)


def _vocab(model: Any) -> int:
    return int(model.config.vocab_size)


def _ids(generator: torch.Generator, n: int, vocab: int) -> list[int]:
    return torch.randint(10, vocab, (n,), generator=generator).tolist()


def _group_mix(vocab: int, seed: int = 0) -> list[list[int]]:
    """Two GRPO-like groups (a 30- and a 20-token prompt), a pair that agrees past its prompt, exact duplicates,
    a member one token past its prompt, a loner and a one-token sequence."""
    g = torch.Generator().manual_seed(seed)
    p1, p2, p3 = _ids(g, 30, vocab), _ids(g, 20, vocab), _ids(g, 12, vocab)
    turn = _ids(g, 9, vocab)
    dup = p2 + _ids(g, 6, vocab)
    return [
        p1 + _ids(g, 5, vocab),
        p2 + _ids(g, 11, vocab),
        [*p1, turn[0]],
        dup,
        p3 + turn + _ids(g, 4, vocab),
        _ids(g, 17, vocab),
        p1 + _ids(g, 14, vocab),
        list(dup),
        p3 + turn + _ids(g, 7, vocab),
        [int(_ids(g, 1, vocab)[0])],
        p1 + _ids(g, 9, vocab),
    ]


def test_groups_are_the_sequences_sharing_a_prefix_with_its_length() -> None:
    seqs = _group_mix(vocab=200)
    groups = prefix_groups(seqs)
    by_member = {m: g for g in groups for m in g.members}
    assert sorted(m for g in groups for m in g.members) == list(range(len(seqs)))
    assert (by_member[0].shared, set(by_member[0].members)) == (30, {0, 2, 6, 10})
    assert (by_member[1].shared, set(by_member[1].members)) == (20, {1, 3, 7})
    assert (by_member[4].shared, set(by_member[4].members)) == (12 + 9, {4, 8})
    assert by_member[5] == PrefixGroup(members=(5,), shared=0)
    assert by_member[9] == PrefixGroup(members=(9,), shared=0)
    # Duplicates alone would share all but their last token: a shared prefix leaves every member a suffix.
    assert prefix_groups([seqs[3], seqs[7]])[0].shared == len(seqs[3]) - 1


def test_a_short_common_prefix_or_a_member_that_would_cost_more_than_it_saves_stays_out() -> None:
    a = list(range(10, 40))
    short = [a[:5] + [1] * 10, a[:5] + [2] * 10]
    assert [g.shared for g in prefix_groups(short)] == [0, 0]
    assert [g.shared for g in prefix_groups(short, min_shared=5)] == [5]
    # Two members sharing 30 tokens save 30; a third sharing 10 with them would make it 2 x 10 = 20.
    trio = [[*a, 1, 2], [*a, 3, 4], a[:10] + [5] * 25]
    groups = prefix_groups(trio)
    assert sorted((g.members, g.shared) for g in groups) == [((0, 1), 30), ((2,), 0)]


def test_micro_batches_hold_whole_groups_within_the_budget_and_cut_a_group_only_when_it_alone_exceeds_it() -> (
    None
):
    seqs = _group_mix(vocab=200)
    bins = pack_prefix_groups(seqs, 80)
    assert sorted(i for b in bins for i in b) == list(range(len(seqs)))
    for b in bins:
        sub = [seqs[i] for i in b]
        cost = sum(computed_tokens([len(sub[m]) for m in g.members], g.shared) for g in prefix_groups(sub))
        assert cost <= 80 or len(b) == 1
    whole = {frozenset(g.members) for g in prefix_groups(seqs)}
    for group in whole:  # every group fits in 80 tokens: none is split
        assert any(group <= set(b) for b in bins)
    # The 30-token prompt's four members compute 30 + 5 + 1 + 14 + 9 = 59 tokens: a 40-token budget cuts them
    # into runs that each compute the prompt once.
    four = [seqs[i] for i in (0, 2, 6, 10)]
    cut = pack_prefix_groups(four, 40)
    assert sorted(i for b in cut for i in b) == [0, 1, 2, 3]
    assert len(cut) > 1
    assert max(len(b) for b in cut) > 1
    for b in cut:
        lengths = [len(four[i]) for i in b]
        assert len(b) == 1 or computed_tokens(lengths, 30) <= 40
    with pytest.raises(ValueError, match="max_tokens must be >= 1"):
        pack_prefix_groups(seqs, 0)


def test_length_buckets_pad_little_and_keep_every_row() -> None:
    lengths = [5, 100, 96, 7, 6, 50, 98, 55]
    buckets = length_buckets(lengths, waste=0.15)
    assert sorted(i for b in buckets for i in b) == list(range(len(lengths)))
    for b in buckets:
        assert len(b) * max(lengths[i] for i in b) <= 1.15 * sum(lengths[i] for i in b)
    # 5, 6 | 7 (three rows of 7 would pad 18 tokens to 21 > 1.15 x 18) | 50, 55 | 96, 98, 100
    assert buckets == [[0, 4], [3], [5, 7], [2, 6, 1]]


def _run(
    policy: Policy, seqs: list[list[int]], layout: str, needed: torch.Tensor | None, loss_on: torch.Tensor
) -> tuple[Any, list[torch.Tensor]]:
    policy.model.zero_grad(set_to_none=True)
    if policy.value_head is not None:
        policy.value_head.zero_grad(set_to_none=True)
    out = policy_forward(policy, seqs, temperature=0.8, values=True, layout=layout, needed=needed)  # type: ignore[arg-type]
    assert out.values is not None
    (out.logprobs[loss_on].sum() + 0.1 * out.entropies[loss_on].sum() + out.values[loss_on].sum()).backward()
    params = [*policy.model.parameters(), *(policy.value_head.parameters() if policy.value_head else [])]
    return out, [p.grad.clone() for p in params if p.grad is not None]


@pytest.mark.parametrize("scored", ["all", "needed"])
def test_results_and_gradients_equal_the_padded_forward(scored: str) -> None:
    policy = Policy.from_pretrained("tiny", value_head=True)
    seqs = _group_mix(vocab=_vocab(policy.model))  # pyright: ignore[reportAttributeAccessIssue]
    lens = [len(s) for s in seqs]
    has_prefix = torch.ones(sum(lens), dtype=torch.bool)
    has_prefix[torch.tensor([0, *lens[:-1]]).cumsum(0)] = False
    needed = None
    loss_on = has_prefix
    if scored == "needed":
        needed = torch.rand(sum(lens), generator=torch.Generator().manual_seed(3)) < 0.5
        loss_on = has_prefix & needed
    padded, padded_grads = _run(policy, seqs, "padded", needed, loss_on)
    grouped, grouped_grads = _run(policy, seqs, "prefix_grouped", needed, loss_on)
    assert torch.equal(grouped.valid, padded.valid)
    assert torch.equal(grouped.valid, loss_on)
    assert grouped.seq_lens == padded.seq_lens
    for name in ("logprobs", "entropies", "values"):
        torch.testing.assert_close(getattr(grouped, name), getattr(padded, name), atol=2e-6, rtol=1e-5)
    assert len(grouped_grads) == len(padded_grads) > 0
    for got, want in zip(grouped_grads, padded_grads, strict=True):
        torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-4)


def test_under_lora_the_adapters_get_the_padded_forward_gradient() -> None:
    base = Policy.from_pretrained("tiny", value_head=False)
    model = get_peft_model(
        base.model,  # pyright: ignore[reportArgumentType]
        LoraConfig(
            r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj"], init_lora_weights=False
        ),
    )
    seqs = _group_mix(vocab=int(model.config.vocab_size), seed=1)  # pyright: ignore[reportAttributeAccessIssue]
    grads: dict[str, list[torch.Tensor]] = {}
    outs: dict[str, torch.Tensor] = {}
    for layout in ("padded", "prefix_grouped"):
        model.zero_grad(set_to_none=True)
        if layout == "padded":
            from mcprl_policy.padded import padded_forward

            out = padded_forward(model, seqs, temperature=1.0)
        else:
            out = prefix_grouped_forward(model, seqs, temperature=1.0)
        out.logprobs.sum().backward()
        outs[layout] = out.logprobs.detach()
        grads[layout] = [p.grad.clone() for p in model.parameters() if p.requires_grad and p.grad is not None]
    torch.testing.assert_close(outs["prefix_grouped"], outs["padded"], atol=2e-6, rtol=1e-5)
    assert len(grads["padded"]) == len(grads["prefix_grouped"]) > 0
    for got, want in zip(grads["prefix_grouped"], grads["padded"], strict=True):
        torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-4)


def test_without_any_shared_prefix_it_is_the_padded_forward_in_buckets() -> None:
    policy = Policy.from_pretrained("tiny", value_head=False)
    g = torch.Generator().manual_seed(5)
    seqs = [_ids(g, n, 200) for n in (3, 40, 8, 41, 2)]
    with torch.no_grad():
        a = policy_forward(policy, seqs, temperature=1.0, values=False, layout="padded")
        b = policy_forward(policy, seqs, temperature=1.0, values=False, layout="prefix_grouped")
    torch.testing.assert_close(b.logprobs, a.logprobs, atol=2e-6, rtol=1e-5)
    torch.testing.assert_close(b.entropies, a.entropies, atol=2e-6, rtol=1e-5)


def test_bad_inputs_and_linear_attention_models_are_refused() -> None:
    policy = Policy.from_pretrained("tiny", value_head=False)
    vocab = _vocab(policy.model)
    with pytest.raises(ValueError, match="no empty sequence"):
        prefix_grouped_forward(policy.model, [[5, 6], []])
    with pytest.raises(ValueError, match=rf"outside the model's vocabulary \(size {vocab}\)"):
        prefix_grouped_forward(policy.model, [[5, 6, 7], [5, vocab + 3]])
    with pytest.raises(ValueError, match=r"needed must be a bool mask of shape \(5,\)"):
        prefix_grouped_forward(policy.model, [[5, 6, 7], [8, 9]], needed=torch.ones(4, dtype=torch.bool))
    config = Qwen3_5TextConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        linear_num_key_heads=2,
        linear_num_value_heads=2,
        linear_key_head_dim=8,
        linear_value_head_dim=8,
        layer_types=["linear_attention", "full_attention"],
    )
    with pytest.raises(UnpackableModelError, match=r"'linear_attention' layers.*use optim.layout: padded"):
        prefix_grouped_forward(Qwen3_5ForCausalLM(config), [[1, 2, 3]])
