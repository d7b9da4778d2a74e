"""The learner on the embedded tiny model: updates change parameters, ratios are healthy, failures diagnosed."""

from __future__ import annotations

import copy
import itertools
import math
import random
from collections.abc import Callable

import attrs
import pytest
import torch
from train_testkit import synthetic_groups

from mcprl_env import Episode, EpisodeGroup
from mcprl_policy import Policy, ReferencePolicy
from mcprl_policy.padded import Layout
from mcprl_train.config import Config
from mcprl_train.errors import CheckpointError, RatioHealthError
from mcprl_train.loop.learner import Learner, check_ratio_health, split_minibatches
from mcprl_train.loop.samples import MicroBatch, episode_sample, micro_batch, pack_indices
from mcprl_train.typed_torch import manual_seed, tensor_list


@pytest.fixture(scope="module")
def policy_state() -> Policy:
    manual_seed(0)
    return Policy.from_pretrained("tiny", value_head=True)


def fresh_policy(template: Policy) -> Policy:
    return copy.deepcopy(template)


def config(*overrides: str) -> Config:
    return Config.load(
        "cpu",
        overrides=[
            "grpo.kl_coef=0.0",
            "optim.lr=1e-3",
            "optim.warmup_steps=0",
            "optim.micro_batch_tokens=64",
            "collection.overlap=false",  # the learner alone: minibatches, epochs and GAE are on the table
            *overrides,
        ],
    )


def test_one_step_changes_trainable_parameters_and_gives_finite_metrics(policy_state: Policy) -> None:
    policy = fresh_policy(policy_state)
    learner = Learner(policy=policy, config=config(), total_steps=10, seed=0)
    before = [p.detach().clone() for p in policy.trainable_parameters()]
    samples, adv = learner.prepare(synthetic_groups(policy))
    metrics = learner.update(samples)
    after = list(policy.trainable_parameters())
    changed = [not torch.equal(a, b) for a, b in zip(before, after, strict=True)]
    assert sum(changed) > len(changed) // 2
    assert metrics["optim/steps"] >= 1
    assert adv["adv/samples"] > 0
    for key, value in {**metrics, **adv}.items():
        assert math.isfinite(value), key


def test_ratios_differ_from_one_after_the_first_optimizer_step(policy_state: Policy) -> None:
    policy = fresh_policy(policy_state)
    learner = Learner(
        policy=policy, config=config("grpo.ppo_epochs=2", "grpo.minibatches=2"), total_steps=10, seed=0
    )
    seen: list[float] = []
    original = learner.micro_step

    def spy(m: MicroBatch, normalizer: torch.Tensor) -> dict[str, float]:
        stats = original(m, normalizer)
        seen.append(stats["ratio/max_abs_dev"])
        return stats

    learner.micro_step = spy  # type: ignore[method-assign]
    samples, _ = learner.prepare(synthetic_groups(policy))
    metrics = learner.update(samples)
    assert metrics["optim/steps"] == 4
    # The recompute pass uses the same packing: before any step the ratios are exactly 1 ...
    first_minibatch = [d for d in seen[: len(seen) // 4]]
    assert max(first_minibatch) == 0.0
    # ... and every pass after an optimizer step sees moved weights.
    assert min(seen[len(seen) // 4 :]) > 0.0


def test_ratios_stuck_at_one_after_a_step_stop_the_run_with_a_diagnosis(policy_state: Policy) -> None:
    policy = fresh_policy(policy_state)
    learner = Learner(policy=policy, config=config("grpo.minibatches=2"), total_steps=10, seed=0)
    for group in learner.optimizer.param_groups:
        group["lr"] = 0.0  # the step runs but moves nothing
    learner.scheduler.base_lrs = [0.0 for _ in learner.scheduler.base_lrs]
    samples, _ = learner.prepare(synthetic_groups(policy))
    with pytest.raises(RatioHealthError, match="exactly 1 after 1 optimizer step"):
        learner.update(samples)


def test_a_loss_without_trainable_gradient_is_diagnosed(policy_state: Policy) -> None:
    policy = fresh_policy(policy_state)
    learner = Learner(policy=policy, config=config(), total_steps=10, seed=0)
    for p in policy.trainable_parameters():
        p.requires_grad_(False)
    samples, _ = learner.prepare(synthetic_groups(policy))
    with pytest.raises((RatioHealthError, RuntimeError)):
        learner.update(samples)


def test_check_ratio_health_names_the_missing_gradient() -> None:
    check_ratio_health(0.0, grad_norm=0.0, optimizer_steps=0)  # before any step: nothing to check
    check_ratio_health(1e-3, grad_norm=1.0, optimizer_steps=2)
    # Every advantage of the previous minibatch was 0 (uniform rewards): no gradient is the right outcome.
    check_ratio_health(0.0, grad_norm=0.0, optimizer_steps=1, signal=False)
    with pytest.raises(RatioHealthError, match="no trainable parameter received gradient"):
        check_ratio_health(0.0, grad_norm=0.0, optimizer_steps=1)
    with pytest.raises(RatioHealthError, match="did not change the weights"):
        check_ratio_health(0.0, grad_norm=0.5, optimizer_steps=1)


def test_zero_variance_groups_are_filtered_and_invalid_episodes_masked(policy_state: Policy) -> None:
    policy = fresh_policy(policy_state)
    learner = Learner(policy=policy, config=config(), total_steps=10, seed=0)
    groups = synthetic_groups(policy, n_groups=2)
    flat = EpisodeGroup(
        group_id="flat",
        task=groups[0].task,
        episodes=[attrs.evolve(e, reward=0.5) for e in groups[0].episodes],
    )
    broken = list(groups[1].episodes)
    broken[0] = attrs.evolve(broken[0], valid=False, reward=0.0)
    samples, metrics = learner.prepare(
        [flat, EpisodeGroup(group_id="b", task=groups[1].task, episodes=broken)]
    )
    assert metrics["adv/zero_std_frac"] == 0.5
    assert len(samples) == len(broken) - 1


def test_gae_estimator_trains_the_value_head(policy_state: Policy) -> None:
    policy = fresh_policy(policy_state)
    learner = Learner(
        policy=policy,
        config=config("model.value_head=true", "grpo.estimator=gae", "grpo.gamma=1.0", "grpo.lam=1.0"),
        total_steps=10,
        seed=0,
    )
    assert policy.value_head is not None
    head = [p.detach().clone() for p in policy.value_head.parameters()]
    samples, _ = learner.prepare(synthetic_groups(policy))
    metrics = learner.update(samples)
    assert "loss/value" in metrics
    assert math.isfinite(metrics["loss/value"])
    assert any(not torch.equal(a, b) for a, b in zip(head, policy.value_head.parameters(), strict=True))


def test_episode_sample_never_trains_the_first_token() -> None:
    e = Episode(
        episode_id="e", task_id="t", group_id="t", token_ids=[5, 6, 7], prompt_length=0, loss_mask=[1, 1, 0],
        sampler_logprobs=[-1.0, -1.0, 0.0], messages=[], reward=1.0, reward_components={}, valid=True,
        success=True, stop_reason="answer", error=None, answer=None, metrics={},
    )  # fmt: skip
    s = episode_sample(e, 0.5)
    assert tensor_list(s.action_mask, bool) == [False, True, False]
    assert tensor_list(s.advantages, float) == [0.0, 0.5, 0.0]


def test_packing_respects_the_budget_and_keeps_every_sequence() -> None:
    lengths = [5, 9, 3, 12, 7, 1]
    bins = pack_indices(lengths, 12)
    assert sorted(i for b in bins for i in b) == list(range(len(lengths)))
    assert all(sum(lengths[i] for i in b) <= 12 for b in bins)
    assert pack_indices([20], 8) == [[0]]
    parts = split_minibatches(7, 3, random.Random(0))
    assert sorted(i for p in parts for i in p) == list(range(7))


def shifted_sampler(groups: list[EpisodeGroup], shift: Callable[[int], float]) -> list[EpisodeGroup]:
    """The groups with the sampler's logprob of policy token ``t`` of each episode lowered by ``shift(t)``."""
    out: list[EpisodeGroup] = []
    for g in groups:
        episodes = [
            attrs.evolve(
                e,
                sampler_logprobs=[
                    x - shift(t) if m else x
                    for t, (x, m) in enumerate(zip(e.sampler_logprobs, e.loss_mask, strict=True))
                ],
            )
            for e in g.episodes
        ]
        out.append(attrs.evolve(g, episodes=episodes))
    return out


def test_mismatch_is_measured_against_the_sampler_logprobs_the_episodes_carry(policy_state: Policy) -> None:
    policy = fresh_policy(policy_state)
    learner = Learner(
        policy=policy,
        config=config("grpo.old_logprobs=recompute", "grpo.minibatches=1"),
        total_steps=10,
        seed=0,
    )
    samples, _ = learner.prepare(synthetic_groups(policy))
    same = learner.update(samples)
    # The sampler logprobs are the policy's own: the learner's recompute agrees up to float error.
    assert same["mismatch/logprob_abs_diff_max"] < 1e-4
    assert same["mismatch/tokens"] == sum(int(s.action_mask.sum()) for s in samples)

    policy = fresh_policy(policy_state)
    learner = Learner(
        policy=policy,
        config=config("grpo.old_logprobs=recompute", "grpo.minibatches=1"),
        total_steps=10,
        seed=0,
    )
    samples, _ = learner.prepare(shifted_sampler(synthetic_groups(policy), lambda t: 0.3))
    got = learner.update(samples)
    # log ρ = log π_learner - log π_sampler = 0.3 on every policy token: k1 = -0.3, k3 = e^0.3 - 1 - 0.3.
    assert got["mismatch/logprob_abs_diff_mean"] == pytest.approx(0.3, abs=1e-4)
    assert got["mismatch/logprob_abs_diff_max"] == pytest.approx(0.3, abs=1e-4)
    assert got["mismatch/kl_k1"] == pytest.approx(-0.3, abs=1e-4)
    assert got["mismatch/kl_k3"] == pytest.approx(math.exp(0.3) - 1.3, abs=1e-4)
    assert "mismatch/tis_capped_frac" not in got


def test_mismatch_is_measured_by_the_single_pass_when_nothing_is_recomputed(policy_state: Policy) -> None:
    policy = fresh_policy(policy_state)
    learner = Learner(policy=policy, config=config("grpo.minibatches=1"), total_steps=10, seed=0)
    assert not learner.recompute_old
    samples, _ = learner.prepare(shifted_sampler(synthetic_groups(policy), lambda t: 0.3))
    got = learner.update(samples)
    # The only pass's forward precedes the optimizer step: it is the learner's π_old, 0.3 above the sampler.
    assert got["mismatch/logprob_abs_diff_mean"] == pytest.approx(0.3, abs=1e-4)
    assert got["mismatch/kl_k3"] == pytest.approx(math.exp(0.3) - 1.3, abs=1e-4)
    assert got["mismatch/tokens"] == sum(int(s.action_mask.sum()) for s in samples)


def test_tis_weights_the_policy_gradient_loss_by_the_truncated_learner_sampler_ratio(
    policy_state: Policy,
) -> None:
    policy = fresh_policy(policy_state)
    cap = 1.5
    learner = Learner(
        policy=policy, config=config(f"grpo.tis={cap}", "grpo.minibatches=1"), total_steps=10, seed=0
    )
    assert learner.recompute_old  # TIS compares the learner's own π_old with the sampler's
    seen: list[tuple[MicroBatch, dict[str, float]]] = []
    original = learner.micro_step

    def spy(m: MicroBatch, normalizer: torch.Tensor) -> dict[str, float]:
        stats = original(m, normalizer)
        seen.append((m, stats))
        return stats

    learner.micro_step = spy  # type: ignore[method-assign]
    # Sampler logprobs off by -0.8 … +0.8 along each turn: ratios π_learner/π_sampler in [e^-0.8, e^0.8].
    samples, _ = learner.prepare(shifted_sampler(synthetic_groups(policy), lambda t: 0.8 * math.sin(t)))
    metrics = learner.update(samples)
    assert 0.0 < metrics["mismatch/tis_capped_frac"] < 1.0
    for m, stats in seen:
        mask = m.mask
        ratio = torch.exp(m.old - m.sampler)
        want = torch.where(mask, torch.clamp(ratio, max=cap), torch.ones_like(ratio))
        assert m.tis is not None
        torch.testing.assert_close(m.tis, want)
        # One minibatch, one epoch: the new policy is the old one, the clipped surrogate is -A per token, and
        # TIS multiplies it by w (verl: pg_losses * rollout_is_weights).
        weighted = (-m.adv * want)[mask]
        assert stats["loss/policy"] == pytest.approx(float(weighted.mean()), rel=1e-4, abs=1e-6)


def test_kl_in_reward_penalises_the_token_rewards_before_gae(policy_state: Policy) -> None:
    policy = fresh_policy(policy_state)
    reference = ReferencePolicy.for_policy(fresh_policy(policy_state))
    assert reference.frozen is not None
    with torch.no_grad():
        for p in reference.frozen.parameters():
            p.add_(0.05 * torch.randn_like(p))  # a reference that disagrees with the policy
    beta = 0.5
    cfg = config(
        "model.value_head=true",
        "grpo.estimator=gae",
        "grpo.gamma=1.0",
        "grpo.lam=1.0",
        "grpo.kl_in_reward=true",
        f"grpo.kl_coef={beta}",
        "grpo.kl_estimator=k1",
    )
    learner = Learner(policy=policy, config=cfg, total_steps=10, seed=0, reference=reference)
    samples, _ = learner.prepare(synthetic_groups(policy))
    micros = [micro_batch(b) for b in learner.pack(samples)]
    metrics = learner.recompute(micros)
    penalties: list[float] = []
    for m in micros:
        assert m.ref is not None
        assert m.old_values is not None
        for i, (s, start) in enumerate(zip(m.samples, [0, *itertools.accumulate(m.lengths)], strict=False)):
            n = m.lengths[i]
            old = tensor_list(m.old[start : start + n], float)
            ref = tensor_list(m.ref[start : start + n], float)
            values = tensor_list(m.old_values[start : start + n], float)
            policy_tokens = [t for t in range(n) if bool(s.action_mask[t])]
            # InstructGPT eq. 2 with k1: r_t = [outcome at the last policy token] - β (log π_old - log π_ref).
            rewards = {t: -beta * (old[t] - ref[t]) for t in policy_tokens}
            rewards[policy_tokens[-1]] += s.reward
            penalties.append(sum(beta * (old[t] - ref[t]) for t in policy_tokens))
            # γ = λ = 1: Â_t = Σ_{k ≥ t} r_k - V_t over policy tokens.
            for k, t in enumerate(policy_tokens):
                want = sum(rewards[u] for u in policy_tokens[k:]) - values[t]
                assert float(m.adv[start + t]) == pytest.approx(want, abs=1e-4)
    assert metrics["kl/reward_penalty"] == pytest.approx(sum(penalties) / len(penalties), abs=1e-5)
    assert abs(metrics["kl/reward_penalty"]) > 1e-3
    assert "loss/kl" not in learner.update_micro_batches(micros)  # the KL is in the reward, not the loss


def test_ema_reference_moves_by_the_formula_every_n_steps(policy_state: Policy) -> None:
    policy = fresh_policy(policy_state)
    ema, every = 0.75, 2
    cfg = config(
        "grpo.kl_coef=0.01", f"reference.every={every}", f"reference.ema={ema}", "grpo.minibatches=1"
    )
    reference = ReferencePolicy.for_policy(policy)
    learner = Learner(policy=policy, config=cfg, total_steps=10, seed=0, reference=reference)
    assert reference.frozen is not None
    want = {k: v.clone() for k, v in reference.frozen.state_dict().items()}
    for step in range(1, 6):
        samples, _ = learner.prepare(synthetic_groups(policy, seed=step))
        learner.update(samples)
        learner.step_reference(step)
        if step % every == 0:
            current = policy.model.state_dict()
            want = {k: ema * v + (1 - ema) * current[k] for k, v in want.items()}
        for name, tensor in reference.frozen.state_dict().items():
            torch.testing.assert_close(tensor, want[name], msg=f"step {step}: {name}")
    assert any(
        not torch.equal(a, b)
        for a, b in zip(
            reference.frozen.state_dict().values(), policy.model.state_dict().values(), strict=True
        )
    )


def test_learner_state_carries_the_moved_reference(policy_state: Policy) -> None:
    cfg = config("grpo.kl_coef=0.01", "reference.every=1", "reference.ema=0.5", "grpo.minibatches=1")
    policy = fresh_policy(policy_state)
    reference = ReferencePolicy.for_policy(policy)
    learner = Learner(policy=policy, config=cfg, total_steps=10, seed=0, reference=reference)
    samples, _ = learner.prepare(synthetic_groups(policy))
    learner.update(samples)
    learner.step_reference(1)
    state = learner.state_dict()
    # A resumed run builds its reference from the restored policy, then loads the saved one over it.
    restored = fresh_policy(policy)
    other_reference = ReferencePolicy.for_policy(restored)
    other = Learner(policy=restored, config=cfg, total_steps=10, seed=0, reference=other_reference)
    assert learner.reference is not None
    assert other.reference is not None
    seqs = [tensor_list(s.token_ids, int) for s in samples[:2]]
    moved = learner.reference.logprobs(seqs).logprobs
    assert (other.reference.logprobs(seqs).logprobs - moved).abs().max() > 1e-5
    other.load_state_dict(state)
    assert other.reference is not None
    assert other_reference.frozen is not None
    assert reference.frozen is not None
    for a, b in zip(
        other_reference.frozen.state_dict().values(),
        reference.frozen.state_dict().values(),
        strict=True,
    ):
        assert torch.equal(a, b)
    without = {k: v for k, v in state.items() if k != "reference"}
    with pytest.raises(CheckpointError, match="no reference weights"):
        other.load_state_dict(without)


@pytest.mark.parametrize("layout", ["padded", "packed"])
@pytest.mark.parametrize("entropy_coef", [0.0, 0.01])
def test_an_update_with_kept_logits_equals_the_update_that_recomputes_them(
    policy_state: Policy, monkeypatch: pytest.MonkeyPatch, layout: str, entropy_coef: float
) -> None:
    import functools

    import mcprl_policy.packed

    def run(keep: int | None) -> tuple[list[torch.Tensor], dict[str, float]]:
        with monkeypatch.context() as patch:
            if keep is not None:
                head_stats = functools.partial(
                    mcprl_policy.packed.token_logprobs_and_entropy, keep_logits_bytes=keep
                )
                # Every layout's heads run through packed.scored_forward.
                patch.setattr(mcprl_policy.packed, "token_logprobs_and_entropy", head_stats)
            policy = fresh_policy(policy_state)
            learner = Learner(
                policy=policy,
                config=config(f"optim.layout={layout}", f"grpo.entropy_coef={entropy_coef}"),
                total_steps=10,
                seed=0,
            )
            samples, _ = learner.prepare(synthetic_groups(policy))
            metrics = learner.update(samples)
            return [p.detach().clone() for p in policy.trainable_parameters()], metrics

    recomputed_params, recomputed = run(0)
    kept_params, kept = run(None)
    assert recomputed == kept
    assert all(torch.equal(a, b) for a, b in zip(recomputed_params, kept_params, strict=True))


def _groups_sharing_their_prompts(policy: Policy) -> list[EpisodeGroup]:
    """`synthetic_groups` with every episode of a group starting with its first episode's prompt."""
    groups = synthetic_groups(policy, n_groups=3, group_size=4)
    out: list[EpisodeGroup] = []
    for group in groups:
        prompt = group.episodes[0].token_ids[: group.episodes[0].prompt_length]
        episodes = [
            attrs.evolve(e, token_ids=[*prompt, *e.token_ids[e.prompt_length :]]) for e in group.episodes
        ]
        out.append(attrs.evolve(group, episodes=episodes))
    return out


def test_a_prefix_grouped_update_equals_the_padded_update_to_float_rounding(policy_state: Policy) -> None:
    def run(layout: str) -> tuple[list[torch.Tensor], dict[str, float]]:
        policy = fresh_policy(policy_state)
        learner = Learner(
            policy=policy,
            config=config(f"optim.layout={layout}", "optim.micro_batch_tokens=96"),
            total_steps=10,
            seed=0,
        )
        samples, _ = learner.prepare(_groups_sharing_their_prompts(policy))
        metrics = learner.update(samples)
        return [p.detach().clone() for p in policy.trainable_parameters()], metrics

    padded_params, padded = run("padded")
    grouped_params, grouped = run("prefix_grouped")
    # Each group's 12-token prompt runs once: 4 members of ~30 tokens fit the 96-token budget as one
    # micro-batch per group instead of ~2 padded ones.
    assert grouped["perf/micro_batches"] < padded["perf/micro_batches"]
    assert grouped["perf/train_tokens"] == padded["perf/train_tokens"]
    # `loss/*` average per-micro-batch values, so they depend on how samples are batched; the gradient does not.
    assert grouped["optim/grad_norm"] == pytest.approx(padded["optim/grad_norm"], rel=1e-5)
    # AdamW's first step moves every weight by about lr whatever its gradient's size, so float rounding in a
    # near-zero gradient can flip a step (at most 2 · lr); everywhere else the weights agree to rounding.
    for got, want in zip(grouped_params, padded_params, strict=True):
        torch.testing.assert_close(got, want, atol=2e-3, rtol=0.0)
        assert float(((got - want).abs() > 1e-6).float().mean()) < 1e-2


def test_the_kl_reference_runs_in_the_learners_layout_with_the_same_gradient(policy_state: Policy) -> None:
    """The reference scores the action tokens in the update's layout; the KL gradient is the same in each."""

    def grad_norm(layout: Layout, kl_coef: float) -> float:
        policy = fresh_policy(policy_state)
        reference = ReferencePolicy.for_policy(policy, layout=layout)
        manual_seed(1)
        with torch.no_grad():  # the policy moves away from its reference: the KL term has a gradient
            for p in policy.trainable_parameters():
                p.add_(0.05 * torch.randn_like(p))
        learner = Learner(
            policy=policy,
            config=config(f"optim.layout={layout}", "optim.micro_batch_tokens=96", f"grpo.kl_coef={kl_coef}"),
            total_steps=10,
            seed=0,
            reference=reference,
        )
        samples, _ = learner.prepare(_groups_sharing_their_prompts(policy))
        return learner.update(samples)["optim/grad_norm"]

    padded = grad_norm("padded", 1.0)
    assert grad_norm("prefix_grouped", 1.0) == pytest.approx(padded, rel=1e-5)
    assert grad_norm("packed", 1.0) == pytest.approx(padded, rel=1e-5)
    assert abs(padded - grad_norm("padded", 0.0)) > 1e-3 * padded  # the KL term is in that gradient


@pytest.mark.parametrize(
    ("profile", "override", "message"),
    [
        ("a100x2", "optim.layout=prefix_grouped", r"prefix_grouped with distributed\.backend=deepspeed"),
        ("cpu", "model.gradient_checkpointing=true", r"prefix_grouped with model\.gradient_checkpointing"),
    ],
)
def test_the_prefix_grouped_layout_is_refused_where_it_cannot_run(
    profile: str, override: str, message: str
) -> None:
    from mcprl_train.errors import ConfigError

    with pytest.raises(ConfigError, match=message):
        Config.load(profile, overrides=["optim.layout=prefix_grouped", override])
