from __future__ import annotations

from pathlib import Path

import pytest
import torch

from mcprl_policy import LoraSettings, Policy, PolicyError, ReferencePolicy
from mcprl_policy.padded import Layout

SEQUENCES = [[1, 5, 9, 33, 7, 2, 8], [4, 4, 100, 250]]


def _train_step(policy: Policy) -> None:
    optimizer = torch.optim.SGD(policy.trainable_parameters(), lr=0.5)
    out = policy.forward_packed(SEQUENCES)
    (-out.logprobs.sum()).backward()
    optimizer.step()
    optimizer.zero_grad()


@pytest.mark.parametrize("lora", [None, LoraSettings(r=4)])
def test_reference_logprobs_equal_the_pre_update_policy(tiny_dir: Path, lora: LoraSettings | None) -> None:
    policy = Policy.from_pretrained(str(tiny_dir), lora=lora)
    with torch.no_grad():
        before = policy.forward_packed(SEQUENCES).logprobs
    reference = ReferencePolicy.for_policy(policy)
    assert reference.shares_weights == (lora is not None)
    _train_step(policy)
    _train_step(policy)  # LoRA's B starts at zero: the second step moves the output
    with torch.no_grad():
        after = policy.forward_packed(SEQUENCES).logprobs
    assert (after - before).abs().max() > 1e-3, "the update did not change the policy"
    torch.testing.assert_close(reference.logprobs(SEQUENCES).logprobs, before)


# Three episodes of one group: a 12-token prompt shared, then their own turns (prefix grouping shares it).
PROMPT = [3, 17, 42, 8, 99, 5, 61, 23, 11, 7, 250, 31]
GROUP = [[*PROMPT, 9, 14, 2], [*PROMPT, 9, 88, 120, 6, 2], [*PROMPT, 40, 2]]


@pytest.mark.parametrize("lora", [None, LoraSettings(r=4)], ids=["copy", "adapters-off"])
@pytest.mark.parametrize("layout", ["packed", "padded", "prefix_grouped"])
def test_each_layout_scores_the_needed_tokens_as_the_full_packed_forward(
    tiny_dir: Path, lora: LoraSettings | None, layout: Layout
) -> None:
    """The KL term reads the sampled tokens only: those match the whole packed forward, the rest read 0."""
    policy = Policy.from_pretrained(str(tiny_dir), lora=lora)
    _train_step(policy)
    _train_step(policy)  # the adapters-off reference now differs from the policy
    whole = ReferencePolicy.for_policy(policy).logprobs(GROUP).logprobs
    needed = torch.tensor([i >= len(PROMPT) + 1 for s in GROUP for i in range(len(s))])
    out = ReferencePolicy.for_policy(policy, layout=layout).logprobs(GROUP, needed=needed)
    torch.testing.assert_close(out.logprobs[needed], whole[needed], atol=2e-6, rtol=1e-5)
    assert bool((out.logprobs[~needed] == 0).all())
    assert torch.equal(out.valid, needed)


def test_ema_update_blends_reference_towards_policy(tiny_dir: Path) -> None:
    policy = Policy.from_pretrained(str(tiny_dir))
    reference = ReferencePolicy.for_policy(policy)
    assert reference.frozen is not None
    old = {k: v.clone() for k, v in reference.frozen.state_dict().items()}
    _train_step(policy)
    new = policy.model.state_dict()
    reference.update(ema=0.9)
    for name, tensor in reference.frozen.state_dict().items():
        torch.testing.assert_close(tensor, 0.9 * old[name] + 0.1 * new[name])
    reference.sync()
    for name, tensor in reference.frozen.state_dict().items():
        torch.testing.assert_close(tensor, new[name])
    assert all(not p.requires_grad for p in reference.frozen.parameters())


def test_lora_reference_cannot_be_ema_updated(tiny_dir: Path) -> None:
    reference = ReferencePolicy.for_policy(Policy.from_pretrained(str(tiny_dir), lora=LoraSettings(r=2)))
    with pytest.raises(PolicyError, match="full fine-tune"):
        reference.sync()


def test_reference_state_round_trips_into_a_fresh_reference(tiny_dir: Path) -> None:
    policy = Policy.from_pretrained(str(tiny_dir))
    reference = ReferencePolicy.for_policy(policy)
    _train_step(policy)
    reference.update(ema=0.5)
    saved = reference.state_dict()
    assert all(t.device.type == "cpu" for t in saved.values())
    fresh = ReferencePolicy.for_policy(Policy.from_pretrained(str(tiny_dir)))
    moved = reference.logprobs(SEQUENCES).logprobs
    assert (fresh.logprobs(SEQUENCES).logprobs - moved).abs().max() > 1e-4
    fresh.load_state_dict(saved)
    torch.testing.assert_close(fresh.logprobs(SEQUENCES).logprobs, reference.logprobs(SEQUENCES).logprobs)
    name = next(iter(saved))
    with pytest.raises(PolicyError, match="missing"):
        fresh.load_state_dict({k: v for k, v in saved.items() if k != name})
    with pytest.raises(PolicyError, match="shape"):
        fresh.load_state_dict({**saved, name: saved[name].flatten()[:1]})
    lora = ReferencePolicy.for_policy(Policy.from_pretrained(str(tiny_dir), lora=LoraSettings(r=2)))
    with pytest.raises(PolicyError, match="full fine-tune"):
        lora.state_dict()
