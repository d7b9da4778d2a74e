"""The update half of the loop: episode groups → advantages → packed PPO/GRPO optimizer steps.

The math is mcprl-grpo's and the packed forward mcprl-policy's; this module owns the orchestration: training
targets from episodes, zero-variance filtering, one packing per iteration reused by every pass, minibatches ×
PPO epochs, gradient accumulation with a global normaliser (so the split never changes the objective), the
scheduler, the reference's EMA/re-sync, truncated importance weights (`grpo.tis`), and the ratio-health check
(`check_ratio_health`). The update runs on the given `mcprl_train.loop.update.UpdateBackend`; the normaliser
and the ratio-health signals are reduced over the ranks (`mcprl_train.collectives`), so every rank makes the
update one process would make on all their samples.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from typing import Any

import structlog
import torch

from mcprl_env import EpisodeGroup
from mcprl_grpo import (
    AggregationMode,
    aggregate_loss,
    aggregation_normalizer,
    clip_metrics,
    clipped_surrogate_loss,
    entropy_loss,
    group_advantages,
    group_metrics,
    ratio_metrics,
    token_kl,
    value_loss,
    value_metrics,
    zero_variance_groups,
)
from mcprl_policy import PackedForward, Policy
from mcprl_policy.prefix_grouped import pack_prefix_groups
from mcprl_train import collectives
from mcprl_train.config import Config
from mcprl_train.errors import CheckpointError, RatioHealthError
from mcprl_train.loop.samples import MicroBatch, Sample, episode_sample, micro_batch, pack_indices
from mcprl_train.loop.targets import kl_reward_metrics, old_policy_targets, sampler_mismatch
from mcprl_train.loop.update import KLReference, TorchBackend, UpdateBackend
from mcprl_train.typed_torch import tensor_list

logger = structlog.get_logger()


def split_minibatches(num_items: int, num: int, rng: random.Random) -> list[list[int]]:
    """Shuffle `range(num_items)` and deal it into `num` (nearly) equal minibatches."""
    idx = list(range(num_items))
    rng.shuffle(idx)
    num = max(1, min(num, num_items))
    return [idx[k::num] for k in range(num)]


def lr_schedule(
    optimizer: torch.optim.Optimizer, warmup_steps: int, total_steps: int, schedule: str
) -> torch.optim.lr_scheduler.LambdaLR:
    """The LR multiplier per scheduler step: linear warmup, then constant, linear or cosine decay to 0."""

    def fn(step: int) -> float:
        if warmup_steps > 0 and step < warmup_steps:
            return (step + 1) / warmup_steps
        progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
        match schedule:
            case "constant":
                return 1.0
            case "linear":
                return 1.0 - progress
            case "cosine":
                return 0.5 * (1.0 + math.cos(math.pi * progress))
            case _:
                raise ValueError(f"unknown lr schedule {schedule!r}")

    return torch.optim.lr_scheduler.LambdaLR(optimizer, fn)


def check_ratio_health(
    max_abs_dev: float, *, grad_norm: float, optimizer_steps: int, signal: bool = True
) -> None:
    """Stop when ratios are exactly 1 after an optimizer step: the update changed nothing the forward reads.

    ``signal`` says whether the previous optimizer step had anything to learn from (a non-zero advantage on a
    trained token); a minibatch of groups whose rewards are all equal legitimately yields no gradient.

    Raises:
        RatioHealthError: with a diagnosis naming the likely cause.
    """
    if optimizer_steps == 0 or max_abs_dev != 0.0 or (grad_norm == 0.0 and not signal):
        return
    if grad_norm == 0.0 or not math.isfinite(grad_norm):
        cause = (
            f"the gradient norm at the previous optimizer step was {grad_norm}: no trainable parameter "
            "received gradient (requires_grad off, LoRA target modules missing, or a detached forward)"
        )
    else:
        cause = (
            "the optimizer step did not change the weights the forward pass reads (optimizer over a different "
            "parameter set, learning rate 0, or weights restored after the step)"
        )
    raise RatioHealthError(
        f"importance ratios are exactly 1 after {optimizer_steps} optimizer step(s) of this iteration: {cause}"
    )


def mean_over_ranks(learned: dict[str, float]) -> dict[str, float]:
    """An update's metrics averaged over the data-parallel ranks (maxima and totals where those are meant)."""
    metrics = collectives.mean_metrics(
        learned,
        maxed=("ratio/max_abs_dev", "mismatch/logprob_abs_diff_max"),
        summed=("perf/train_tokens", "perf/micro_batches", "perf/filler_sequences", "mismatch/tokens"),
    )
    metrics["perf/world_size"] = float(collectives.world_size())
    return metrics


class Learner:
    """Owns the scheduler, the shuffling RNG and the reference policy; turns episode groups into updates.

    Args:
        policy: The trained policy.
        config: The run config (reads `grpo`, `optim`, `sampling.temperature`, `env.max_total_tokens`).
        total_steps: Training steps, for the LR schedule.
        seed: Seed of the minibatch shuffling (the same on every rank).
        reference: The KL reference (needed when `grpo.kl_coef > 0`); it follows the policy as `reference`
            says (`step_reference`) and is part of `state_dict` when it is a copy.
        backend: Where the update runs; None: `TorchBackend` in this process.
    """

    def __init__(
        self,
        *,
        policy: Policy,
        config: Config,
        total_steps: int,
        seed: int,
        reference: KLReference | None = None,
        backend: UpdateBackend | None = None,
    ) -> None:
        self.policy = policy
        self.grpo = config.grpo
        self.reference_cfg = config.reference
        self.optim_cfg = config.optim
        self.temperature = float(config.sampling.temperature)
        self.max_total_tokens = int(config.env.max_total_tokens)
        self.mode: AggregationMode = self.grpo.aggregation
        self.reference = reference
        if self.grpo.kl_coef > 0 and reference is None:
            raise ValueError("grpo.kl_coef > 0 needs a reference policy")
        self.backend = backend if backend is not None else TorchBackend(policy, config.optim)
        self.optimizer = self.backend.optimizer
        self.scheduler = lr_schedule(
            self.optimizer, self.optim_cfg.warmup_steps, total_steps, self.optim_cfg.scheduler
        )
        self.rng = random.Random(seed)

    @property
    def needs_values(self) -> bool:
        return self.grpo.estimator == "gae"

    @property
    def recompute_old(self) -> bool:
        """`mcprl_train.config.GRPOConfig.recomputes_old_logprobs`."""
        return self.grpo.recomputes_old_logprobs

    @property
    def reference_copy(self) -> KLReference | None:
        """The reference when it is a copy of its own (full fine-tune), which checkpoints must carry."""
        if self.reference is None or self.reference.shares_weights:
            return None
        return self.reference

    def state_dict(self) -> dict[str, Any]:
        state = {
            **self.backend.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "rng": self.rng.getstate(),
        }
        if (ref := self.reference_copy) is not None:
            state["reference"] = ref.state_dict()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.backend.load_state_dict(state)
        self.scheduler.load_state_dict(state["scheduler"])
        self.rng.setstate(state["rng"])
        if (ref := self.reference_copy) is not None:
            if "reference" not in state:
                raise CheckpointError(
                    "the checkpoint's learner state has no reference weights but this run's reference is a copy "
                    "(grpo.kl_coef > 0, full fine-tune): it was saved by a run without a reference copy"
                )
            ref.load_state_dict(state["reference"])

    def sync_reference(self) -> None:
        """Copy the current weights into the reference policy (full fine-tune; no-op for LoRA references)."""
        if self.reference is not None and not self.reference.shares_weights:
            self.reference.sync()

    def step_reference(self, step: int) -> None:
        """After GRPO step ``step``: ``ref ← ema·ref + (1-ema)·policy`` every `reference.every` steps."""
        every = self.reference_cfg.every
        if self.reference is not None and every and step % every == 0:
            self.reference.update(ema=self.reference_cfg.ema)

    # -- advantages --------------------------------------------------------------------------------------

    def prepare(self, groups: Sequence[EpisodeGroup]) -> tuple[list[Sample], dict[str, float]]:
        """Episode groups → samples with advantages; zero-variance groups counted (and dropped if configured).

        Invalid episodes (infrastructure failures) are excluded from baselines and from the loss.
        """
        episodes = [e for g in groups for e in g.episodes]
        if not episodes:
            return [], {"adv/groups": 0.0, "adv/zero_std_frac": 0.0, "adv/samples": 0.0}
        rewards = torch.tensor([float(e.reward) for e in episodes], dtype=torch.float32)
        valid = torch.tensor([bool(e.valid) for e in episodes])
        gids = torch.cat([torch.full((len(g.episodes),), k) for k, g in enumerate(groups)])
        flat = zero_variance_groups(rewards, gids, valid=valid, num_groups=len(groups))
        metrics = group_metrics(rewards, gids, valid=valid, num_groups=len(groups))
        estimator = self.grpo.estimator
        if estimator == "gae":
            adv = torch.zeros_like(rewards)  # per-token GAE later, from the old values
        else:
            adv = group_advantages(rewards, gids, estimator=estimator, valid=valid, num_groups=len(groups))
        keep = valid & ~(flat[gids] if self.grpo.filter_zero_std else torch.zeros_like(valid))
        samples = [
            episode_sample(e, float(a))
            for e, a, k in zip(episodes, tensor_list(adv, float), tensor_list(keep, bool), strict=True)
            if k
        ]
        metrics["adv/samples"] = float(len(samples))
        metrics["adv/informative_groups"] = metrics["adv/groups"] - float(flat.sum())
        metrics["adv/abs_mean"] = float(adv[keep].abs().mean()) if bool(keep.any()) else 0.0
        return samples, metrics

    # -- the update --------------------------------------------------------------------------------------

    def forward(self, m: MicroBatch) -> PackedForward:
        """The policy's forward over ``m``: its action tokens scored (every token when values train: GAE)."""
        needed = None if self.needs_values else m.mask
        return self.backend.forward(
            m.ids, temperature=self.temperature, values=self.needs_values, needed=needed
        )

    def pack(self, samples: Sequence[Sample]) -> list[list[Sample]]:
        """Pack once per iteration: the recompute pass and every epoch see the same micro-batches.

        The token budget is `optim.micro_batch_tokens`, lowered so each optimizer step accumulates over at
        least `optim.grad_accum` micro-batches.
        """
        lengths = [int(s.token_ids.numel()) for s in samples]
        per_step = -(-sum(lengths) // (self.grpo.minibatches * self.optim_cfg.grad_accum))
        budget = max(1, min(self.optim_cfg.micro_batch_tokens, per_step))
        if self.optim_cfg.layout == "prefix_grouped":
            bins = pack_prefix_groups([tensor_list(s.token_ids, int) for s in samples], budget)
        else:
            bins = pack_indices(lengths, budget)
        return [[samples[i] for i in b] for b in bins]

    @torch.no_grad()
    def recompute(self, micros: Sequence[MicroBatch]) -> dict[str, float]:
        """Reference logprobs when KL is on; the learner's old logprobs and what follows from them (`targets`).

        Returns:
            ``kl/reward_penalty`` with ``grpo.kl_in_reward`` (`mcprl_train.loop.targets.kl_reward_metrics`).
        """
        penalty: torch.Tensor | float = 0.0
        for m in micros:
            if self.reference is not None and self.grpo.kl_coef > 0:
                ref = self.reference.logprobs(m.ids, temperature=self.temperature, needed=m.mask)
                m.ref = ref.logprobs.float()
            if self.recompute_old:
                penalty += old_policy_targets(m, self.forward(m), self.grpo, values=self.needs_values)
        return kl_reward_metrics(micros, penalty=penalty) if self.grpo.kl_in_reward else {}

    def update(self, samples: Sequence[Sample]) -> dict[str, float]:
        """PPO epochs × minibatches over packed micro-batches; one scheduler step per call.

        Collective: every rank calls it with its own samples (possibly none); when no rank has a sample the
        update is skipped everywhere.

        Returns:
            Averages of `loss/*`, `ratio/*`, `clip/*`, `kl/*`, `value/*` over micro-batches, and `optim/*`.
        """
        if collectives.all_reduce_scalar(float(len(samples))) == 0:
            return {"optim/skipped": 1.0}
        self.policy.train()
        batches, fillers = self.backend.lay_out(self.pack(samples) if samples else [])
        metrics = self.update_micro_batches([micro_batch(b, device=self.policy.device) for b in batches])
        metrics["perf/filler_sequences"] = float(fillers)
        return metrics

    def update_micro_batches(self, micros: list[MicroBatch]) -> dict[str, float]:
        """`update` on micro-batches already laid out."""
        recomputed = self.recompute(micros)
        acc: dict[str, list[float]] = {}
        steps = 0
        grad_norm = float("nan")
        signal = True
        for _epoch in range(self.grpo.ppo_epochs):
            for mb in split_minibatches(len(micros), self.grpo.minibatches, self.rng):
                group = [micros[i] for i in mb]
                normalizer = collectives.all_reduce_tensor(
                    torch.stack(
                        [aggregation_normalizer(m.mask, mode=self.mode, seq_ids=m.seq_ids) for m in group]
                    ).sum(),
                    "sum",
                )
                self.backend.zero_grad()
                max_dev = 0.0
                for m in group:
                    stats = self.micro_step(m, normalizer)
                    max_dev = max(max_dev, stats["ratio/max_abs_dev"])
                    for k, v in stats.items():
                        acc.setdefault(k, []).append(v)
                if self.recompute_old:
                    check_ratio_health(
                        collectives.all_reduce_scalar(max_dev, "max"),
                        grad_norm=grad_norm,
                        optimizer_steps=steps,
                        signal=signal,
                    )
                    # Only the check reads it: no extra reduction (a collective under DeepSpeed) otherwise.
                    local = max(float((m.adv * m.mask).abs().max()) for m in group)
                    signal = collectives.all_reduce_scalar(local, "max") > 0.0
                grad_norm = self.backend.step()
                acc.setdefault("optim/grad_norm", []).append(grad_norm)
                steps += 1
        self.scheduler.step()
        metrics = {k: sum(v) / len(v) for k, v in acc.items()}
        metrics["ratio/max_abs_dev"] = max(acc.get("ratio/max_abs_dev", [0.0]))
        metrics["optim/lr"] = float(self.optimizer.param_groups[0]["lr"])
        metrics["optim/steps"] = float(steps)
        metrics["perf/micro_batches"] = float(len(micros))
        metrics["perf/train_tokens"] = float(sum(len(i) for m in micros for i in m.ids))
        return metrics | recomputed | sampler_mismatch(micros, self.grpo)

    def micro_step(self, m: MicroBatch, normalizer: torch.Tensor) -> dict[str, float]:
        """Forward + backward of one micro-batch, aggregated with the minibatch's global normaliser."""
        g = self.grpo
        out = self.forward(m)
        new = out.logprobs.float()
        if m.learner_old is None:
            # Nothing was recomputed, so this is the only pass (one epoch, one minibatch): no optimizer step has
            # run yet and this forward is the learner's π_old.
            m.learner_old = new.detach()
        token_loss = clipped_surrogate_loss(
            new, m.old, m.adv, m.mask, eps_low=g.clip_eps_low, eps_high=g.clip_eps_high, dual_clip=g.dual_clip
        )
        if m.tis is not None:
            # Yao et al. 2025: the policy-gradient term only, as verl's compute_policy_loss (pg_losses * w).
            token_loss = token_loss * m.tis
        stats: dict[str, float] = {}
        with torch.no_grad():
            stats["loss/policy"] = float(aggregate_loss(token_loss.detach(), m.mask, mode="token-mean"))
        if m.ref is not None and not g.kl_in_reward:
            kl = token_kl(new, m.ref, m.mask, estimator=g.kl_estimator)
            token_loss = token_loss + g.kl_coef * kl
            stats["loss/kl"] = float(aggregate_loss(kl.detach(), m.mask, mode="token-mean"))
        if g.entropy_coef > 0:
            token_loss = token_loss + entropy_loss(out.entropies.float(), m.mask, coef=g.entropy_coef)
        if self.needs_values:
            assert out.values is not None
            assert m.old_values is not None
            assert m.returns is not None
            values = out.values.float()
            vl = value_loss(values, m.old_values, m.returns, m.mask, clip=g.value_clip)
            token_loss = token_loss + g.value_coef * vl
            stats["loss/value"] = float(aggregate_loss(vl.detach(), m.mask, mode="token-mean"))
            stats.update(value_metrics(values, m.returns, m.mask))
        loss = aggregate_loss(
            token_loss,
            m.mask,
            mode=self.mode,
            normalizer=normalizer,
            max_tokens=self.max_total_tokens,
            seq_ids=m.seq_ids,
        )
        self.backend.backward(loss)
        stats["loss/total"] = float(loss.detach())
        stats["loss/entropy"] = float(
            aggregate_loss(out.entropies.detach().float(), m.mask, mode="token-mean")
        )
        stats.update(ratio_metrics(new, m.old, m.mask))
        stats.update(
            clip_metrics(
                new,
                m.old,
                m.adv,
                m.mask,
                eps_low=g.clip_eps_low,
                eps_high=g.clip_eps_high,
                dual_clip=g.dual_clip,
            )
        )
        return stats
