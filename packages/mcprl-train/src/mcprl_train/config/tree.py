"""The typed config tree of a training run, its profiles and its overrides.

A run's config is resolved in layers, later layers winning key by key (deep merge):

1. the defaults of the attrs classes below (the seeds' hyperparameters where they make sense),
2. a profile shipped with the package (``profiles/<name>.yaml``: ``cpu`` is the default),
3. a user file (``--config FILE``, YAML or JSON),
4. ``--set section.key=value`` overrides (values parsed as YAML scalars/flow: ``3``, ``0.1``, ``true``,
   ``null``, ``[a, b]``).

Unknown keys are an error naming the key path and the nearest valid key; wrong values are an error naming
the key, the value and what was expected. ``Config.to_dict()`` is the resolved config a run saves.

Example:
    >>> cfg = Config.load(profile="cpu", overrides=["grpo.group_size=8"])
    >>> cfg.grpo.group_size
    8
"""

from __future__ import annotations

import difflib
import typing
from collections.abc import Mapping, Sequence
from importlib import resources
from pathlib import Path
from typing import Any, Literal

import attrs
import yaml

from mcprl_train.config.layers import (
    check_value,
    deep_merge,
    parse_override,
    plain_data,
    read_config_file,
    unknown_key_message,
)
from mcprl_train.errors import ConfigError

__all__ = [
    "Config",
    "DistributedConfig",
    "EnvSection",
    "EvalConfig",
    "GRPOConfig",
    "LoraConfig",
    "ModelConfig",
    "OptimConfig",
    "RewardSection",
    "RunConfig",
    "SFTConfig",
    "SamplerConfig",
    "TasksConfig",
    "ToolsConfig",
    "TrackingConfig",
    "list_profiles",
]

DType = Literal["float32", "bfloat16", "float16"]
Estimator = Literal["grpo", "dr_grpo", "rloo", "reinforce_pp", "gae"]
KLEstimator = Literal["k1", "k2", "k3"]
Aggregation = Literal["token_mean", "seq_mean_token_mean", "seq_mean_token_sum", "dr_grpo"]
Scheduler = Literal["constant", "linear", "cosine"]
WandbMode = Literal["auto", "online", "offline", "disabled"]
DEFAULT_PROFILE = "cpu"
DEFAULT_OFFLINE_SERVERS = ("calculator", "finance", "search", "python", "messaging")
_TOOL_SOURCES = ("servers", "mcp_servers", "offline")


# -- validators: raise ValueError("<field> ..."); `_build_section` prefixes the section path ------------------


def _ge(bound: float) -> Any:
    def check(_: object, attribute: attrs.Attribute[Any], value: float | None) -> None:
        if value is not None and value < bound:
            raise ValueError(f"{attribute.name}: expected a value >= {bound}, got {value!r}")

    return check


def _gt(bound: float) -> Any:
    def check(_: object, attribute: attrs.Attribute[Any], value: float | None) -> None:
        if value is not None and value <= bound:
            raise ValueError(f"{attribute.name}: expected a value > {bound}, got {value!r}")

    return check


def _le(bound: float) -> Any:
    def check(_: object, attribute: attrs.Attribute[Any], value: float | None) -> None:
        if value is not None and value > bound:
            raise ValueError(f"{attribute.name}: expected a value <= {bound}, got {value!r}")

    return check


def _check_device(_: object, attribute: attrs.Attribute[str], value: str) -> None:
    base, _sep, index = value.partition(":")
    if base not in ("auto", "cpu", "cuda", "mps") or (index and not (base == "cuda" and index.isdigit())):
        raise ValueError(f"{attribute.name}: expected auto, cpu, cuda, cuda:N or mps, got {value!r}")


def _check_run_name(_: object, attribute: attrs.Attribute[str | None], value: str | None) -> None:
    if value is not None and (not value or "/" in value or value in (".", "..")):
        raise ValueError(f"{attribute.name}: expected a directory name without '/', got {value!r}")


# -- sections --------------------------------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class ModelConfig:
    """The policy model.

    Attributes:
        name: ``"tiny"`` (the embedded test model), a hub id (``Qwen/Qwen3-0.6B``) or a local directory.
        dtype: Parameter dtype of the trainable model.
        device: ``"auto"`` (cuda > mps > cpu), ``"cpu"``, ``"cuda"``, ``"cuda:N"`` or ``"mps"``.
        gradient_checkpointing: Recompute activations in backward (less memory, ~30% more compute).
        value_head: Attach a scalar value head (needed by the ``gae`` estimator).
    """

    name: str = attrs.field(default="tiny", validator=attrs.validators.min_len(1))
    dtype: DType = "float32"
    device: str = attrs.field(default="cpu", validator=_check_device)
    gradient_checkpointing: bool = False
    value_head: bool = True


@attrs.frozen(kw_only=True)
class LoraConfig:
    """LoRA adapters (Hu et al. 2021); ``target_modules`` empty picks them by architecture."""

    enabled: bool = False
    r: int = attrs.field(default=16, validator=_gt(0))
    alpha: float = attrs.field(default=32.0, validator=_gt(0.0))
    dropout: float = attrs.field(default=0.0, validator=[_ge(0.0), _le(0.99)])
    target_modules: tuple[str, ...] = ()


@attrs.frozen(kw_only=True)
class SamplerConfig:
    """Rollout generation.

    Attributes:
        backend: ``hf`` generates from the live weights; ``vllm`` gets adapters/weights pushed after updates.
        temperature: Sampling temperature (the learner recomputes logprobs at the same temperature).
        top_p: Nucleus truncation (1.0 = off).
        max_new_tokens_per_turn: Cap on one assistant turn.
        max_batch_size: Requests batched into one generate call.
        max_wait_ms: How long the batcher waits to fill a batch.
        prefix_cache_mb: HF backend: memory for reusing an episode's KV cache from one turn to the next (only
            the new tokens of a turn are prefilled); 0 prefills every turn whole.
        gpu_memory_utilization: vLLM's share of the device memory (also used by ``mcprl-train plan``).
    """

    backend: Literal["hf", "vllm"] = "hf"
    temperature: float = attrs.field(default=1.0, validator=_gt(0.0))
    top_p: float = attrs.field(default=1.0, validator=[_gt(0.0), _le(1.0)])
    max_new_tokens_per_turn: int = attrs.field(default=256, validator=_ge(1))
    max_batch_size: int = attrs.field(default=64, validator=_ge(1))
    max_wait_ms: float = attrs.field(default=5.0, validator=_ge(0.0))
    prefix_cache_mb: float = attrs.field(default=1024.0, validator=_ge(0.0))
    gpu_memory_utilization: float = attrs.field(default=0.3, validator=[_gt(0.0), _le(0.95)])


@attrs.frozen(kw_only=True)
class ToolsConfig:
    """Which MCP servers the episodes talk to: exactly one of the three sources.

    Attributes:
        servers: Path to an ``{"mcpServers": {...}}`` file (JSON/YAML/TOML; `mcprl_tools.ServersConfig.load`).
        mcp_servers: The ``mcpServers`` mapping inline (name → ``{"command", "args", "env", ...}``);
            ``${VAR}`` in values refers to environment variables.
        offline: Names of the bundled offline servers (`mcprl_servers.config.default_servers_config`).
        allow_tools: Per-server allow-lists applied on top of any source (server → exposed tool names; servers
            not named expose every tool). Fewer tools make shorter prompts for small models.
    """

    servers: str | None = None
    mcp_servers: dict[str, Any] | None = None
    offline: tuple[str, ...] | None = None
    allow_tools: dict[str, tuple[str, ...]] = attrs.field(factory=dict)

    def __attrs_post_init__(self) -> None:
        given = [n for n in _TOOL_SOURCES if getattr(self, n) is not None]
        if len(given) > 1:
            raise ValueError(
                f"servers/mcp_servers/offline: expected one tools source, got {given} (set the others to null)"
            )
        if not given:  # the default source: every bundled offline server
            object.__setattr__(self, "offline", DEFAULT_OFFLINE_SERVERS)

    @property
    def source(self) -> Literal["servers", "mcp_servers", "offline"]:
        """Which of the three sources is set."""
        if self.servers is not None:
            return "servers"
        return "mcp_servers" if self.mcp_servers is not None else "offline"


@attrs.frozen(kw_only=True)
class TasksConfig:
    """Task data (JSON array or JSON lines, see docs/INTERFACES.md).

    Attributes:
        train: Path of the training tasks, or ``preset:<name>`` for a bundled `mcprl_tasks` set.
        validation: Path of the validation tasks, or ``preset:<name>`` for that preset's validation split;
            None disables evaluation.
        shuffle_buffer: Size of the streaming shuffle buffer (1 = file order).
    """

    train: str = attrs.field(default="preset:default", validator=attrs.validators.min_len(1))
    validation: str | None = "preset:default"
    shuffle_buffer: int = attrs.field(default=1024, validator=_ge(1))


_DEFAULT_TURNS = {"easy": 5, "medium": 8, "hard": 10}


def _fill_turns(value: Mapping[str, int]) -> dict[str, int]:
    return {**_DEFAULT_TURNS, **value}


def _check_turns(_: object, attribute: attrs.Attribute[Any], value: Mapping[str, int]) -> None:
    if set(value) != set(_DEFAULT_TURNS):
        raise ValueError(
            f"{attribute.name}: expected exactly the keys easy, medium, hard, got {sorted(value)}"
        )
    if any(v < 1 for v in value.values()):
        raise ValueError(f"{attribute.name}: expected turn limits >= 1, got {dict(value)}")


@attrs.frozen(kw_only=True)
class EnvSection:
    """How episodes run (mapped onto `mcprl_env.EnvConfig`).

    Attributes:
        max_turns_by_difficulty: Assistant-turn limit per difficulty; keys not given keep 5 / 8 / 10.
        max_total_tokens: Token budget of a whole episode (prompt + every turn).
        max_tool_output_tokens: Tool responses are cut to this many tokens (with a visible marker).
        max_concurrent_episodes: Episodes in flight during collection.
    """

    max_turns_by_difficulty: dict[str, int] = attrs.field(
        factory=lambda: dict(_DEFAULT_TURNS), converter=_fill_turns, validator=_check_turns
    )
    max_total_tokens: int = attrs.field(default=4096, validator=_ge(16))
    max_tool_output_tokens: int = attrs.field(default=512, validator=_ge(1))
    max_concurrent_episodes: int = attrs.field(default=64, validator=_ge(1))


@attrs.frozen(kw_only=True)
class RewardSection:
    """Reward weights by reward function name (empty: `mcprl_env.DEFAULT_REWARD_WEIGHTS`)."""

    weights: dict[str, float] = attrs.field(factory=dict)


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
        kl_in_reward: Subtract β·KL from the reward instead of adding it to the loss.
        value_coef: Weight of the (clipped) value loss (``gae`` only).
        gamma: Discount γ (GAE).
        lam: GAE λ.
        entropy_coef: Entropy bonus weight.
        aggregation: How per-token losses are reduced.
        ppo_epochs: Passes over each rollout batch.
        minibatches: Optimizer steps per epoch.
        filter_zero_std: Drop groups whose rewards are all equal and back-fill with fresh groups.
        backfill_rounds: Extra collection rounds per step that replace filtered groups (0 = no back-fill).
        old_logprobs: ``sampler``: the sampler's logprobs are the old policy's (one update per batch);
            ``recompute``: a no-grad trainer forward before the update (forced when ppo_epochs × minibatches > 1
            or with ``gae``, so the ratio health check compares like with like).
        value_clip: Clip range of the value loss around the old values (``gae``).
    """

    group_size: int = attrs.field(default=8, validator=_ge(2))
    tasks_per_step: int = attrs.field(default=8, validator=_ge(1))
    estimator: Estimator = "grpo"
    clip_eps_low: float = attrs.field(default=0.2, validator=[_gt(0.0), _le(1.0)])
    clip_eps_high: float = attrs.field(default=0.2, validator=_gt(0.0))
    dual_clip: float | None = attrs.field(default=None, validator=_gt(1.0))
    kl_coef: float = attrs.field(default=0.01, validator=_ge(0.0))
    kl_estimator: KLEstimator = "k3"
    kl_in_reward: bool = False
    value_coef: float = attrs.field(default=0.5, validator=_ge(0.0))
    gamma: float = attrs.field(default=0.99, validator=[_ge(0.0), _le(1.0)])
    lam: float = attrs.field(default=0.95, validator=[_ge(0.0), _le(1.0)])
    entropy_coef: float = attrs.field(default=0.0, validator=_ge(0.0))
    aggregation: Aggregation = "token_mean"
    ppo_epochs: int = attrs.field(default=1, validator=_ge(1))
    minibatches: int = attrs.field(default=2, validator=_ge(1))
    filter_zero_std: bool = True
    backfill_rounds: int = attrs.field(default=1, validator=_ge(0))
    old_logprobs: Literal["sampler", "recompute"] = "sampler"
    value_clip: float = attrs.field(default=0.2, validator=_gt(0.0))


@attrs.frozen(kw_only=True)
class OptimConfig:
    """AdamW, its schedule and gradient handling.

    ``micro_batch_tokens`` bounds one forward/backward (gradient accumulation over micro-batches);
    ``layout`` is ``packed`` (one row, block-diagonal mask: GPUs with varlen attention) or ``padded``
    (length-sorted right-padded rows: cheaper on CPU, see `mcprl_policy.padded`); ``logits_chunk_size`` is
    how many token rows get their vocabulary logits at once (peak logits memory ∝ rows × vocabulary).
    """

    lr: float = attrs.field(default=5e-6, validator=_gt(0.0))
    warmup_steps: int = attrs.field(default=10, validator=_ge(0))
    weight_decay: float = attrs.field(default=0.0, validator=_ge(0.0))
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = attrs.field(default=1e-8, validator=_gt(0.0))
    grad_accum: int = attrs.field(default=1, validator=_ge(1))
    max_grad_norm: float = attrs.field(default=1.0, validator=_gt(0.0))
    scheduler: Scheduler = "constant"
    micro_batch_tokens: int = attrs.field(default=8192, validator=_ge(16))
    layout: Literal["packed", "padded"] = "packed"
    logits_chunk_size: int = attrs.field(default=1024, validator=_ge(1))


@attrs.frozen(kw_only=True)
class SFTConfig:
    """Optional supervised warm-up on scripted demonstrations before RL.

    ``warmup_steps`` ramps the learning rate linearly; ``max_grad_norm`` clips the gradient (SFT has its own
    optimizer; packing uses ``optim.micro_batch_tokens``). ``teacher_noise`` is the fraction of demonstrations
    written by the imperfect teacher (`mcprl_tasks.imperfect_teacher`; the rest are ideal); ``teacher_typos`` is
    that teacher's chance per ticker lookup (at most once per demonstration) to mistype the ticker, read the
    server's error and retry with the right one (its ``p_typo``). ``eval_every``
    validates every N SFT steps (0: only after the stage); ``max_time_s`` ends the stage after that many
    seconds (the continued-SFT baseline of the demo uses it to match GRPO's wall-clock).
    """

    enabled: bool = False
    epochs: int = attrs.field(default=1, validator=_ge(1))
    steps: int | None = attrs.field(default=None, validator=_ge(1))
    lr: float = attrs.field(default=1e-4, validator=_gt(0.0))
    batch_size: int = attrs.field(default=8, validator=_ge(1))
    demos: int = attrs.field(default=64, validator=_ge(1))
    teacher_noise: float = attrs.field(default=0.0, validator=[_ge(0.0), _le(1.0)])
    teacher_typos: float = attrs.field(default=0.0, validator=[_ge(0.0), _le(1.0)])
    warmup_steps: int = attrs.field(default=0, validator=_ge(0))
    max_grad_norm: float = attrs.field(default=1.0, validator=_gt(0.0))
    eval_every: int = attrs.field(default=0, validator=_ge(0))
    max_time_s: float | None = attrs.field(default=None, validator=_gt(0.0))


@attrs.frozen(kw_only=True)
class EvalConfig:
    """Evaluation on the validation tasks every ``every`` steps (0 disables periodic evaluation)."""

    every: int = attrs.field(default=10, validator=_ge(0))
    n_tasks: int = attrs.field(default=32, validator=_ge(1))
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
        ref_sync_every: Copy the policy into the reference every N steps (full fine-tune; 0 = never).
        checkpoint_every: Steps between checkpoints (0 = only at the end).
        keep_checkpoints: Number of checkpoints kept (oldest removed first).
        rollout_retries: Re-runs of a group that lost most episodes to infrastructure faults.
    """

    name: str | None = attrs.field(default=None, validator=_check_run_name)
    output_dir: str = "outputs"
    seed: int = 0
    steps: int = attrs.field(default=100, validator=_ge(0))
    max_invalid_rate: float = attrs.field(default=0.2, validator=[_ge(0.0), _le(1.0)])
    ref_sync_every: int = attrs.field(default=100, validator=_ge(0))
    checkpoint_every: int = attrs.field(default=10, validator=_ge(0))
    keep_checkpoints: int = attrs.field(default=3, validator=_ge(1))
    rollout_retries: int = attrs.field(default=1, validator=_ge(0))


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
    """

    backend: Literal["none", "deepspeed"] = "none"
    zero_stage: Literal[0, 1, 2, 3] = 0
    num_gpus: int = attrs.field(default=1, validator=_ge(1))
    bf16: bool = False
    device_memory_gb: float | None = attrs.field(default=None, validator=_gt(0.0))


_SECTIONS: dict[str, type] = {
    "model": ModelConfig,
    "lora": LoraConfig,
    "sampler": SamplerConfig,
    "tools": ToolsConfig,
    "tasks": TasksConfig,
    "env": EnvSection,
    "reward": RewardSection,
    "grpo": GRPOConfig,
    "optim": OptimConfig,
    "sft": SFTConfig,
    "eval": EvalConfig,
    "run": RunConfig,
    "tracking": TrackingConfig,
    "distributed": DistributedConfig,
}
_SCALARS: dict[str, Any] = {"profile": str, "quantization": Literal["nf4"] | None}


@attrs.frozen(kw_only=True)
class Config:
    """The resolved config of a run: one frozen section per concern.

    Build it with `Config.load` (profile + file + overrides) or `Config.from_dict`; save it with `to_dict`.
    ``quantization="nf4"`` loads the base model in 4 bit (QLoRA: needs ``lora.enabled``).
    """

    profile: str = DEFAULT_PROFILE
    quantization: Literal["nf4"] | None = None
    model: ModelConfig = attrs.field(factory=ModelConfig)
    lora: LoraConfig = attrs.field(factory=LoraConfig)
    sampler: SamplerConfig = attrs.field(factory=SamplerConfig)
    tools: ToolsConfig = attrs.field(factory=ToolsConfig)
    tasks: TasksConfig = attrs.field(factory=TasksConfig)
    env: EnvSection = attrs.field(factory=EnvSection)
    reward: RewardSection = attrs.field(factory=RewardSection)
    grpo: GRPOConfig = attrs.field(factory=GRPOConfig)
    optim: OptimConfig = attrs.field(factory=OptimConfig)
    sft: SFTConfig = attrs.field(factory=SFTConfig)
    eval: EvalConfig = attrs.field(factory=EvalConfig)
    run: RunConfig = attrs.field(factory=RunConfig)
    tracking: TrackingConfig = attrs.field(factory=TrackingConfig)
    distributed: DistributedConfig = attrs.field(factory=DistributedConfig)

    def __attrs_post_init__(self) -> None:
        if self.quantization is not None and not self.lora.enabled:
            raise ConfigError(
                f"quantization: {self.quantization!r} needs lora.enabled=true (a 4-bit base model is frozen; "
                "only adapters train)"
            )
        if self.grpo.estimator == "gae" and not self.model.value_head:
            raise ConfigError("grpo.estimator: 'gae' needs model.value_head=true")
        if self.distributed.backend == "none" and self.distributed.zero_stage != 0:
            raise ConfigError("distributed.zero_stage: a ZeRO stage needs distributed.backend=deepspeed")

    @classmethod
    def load(
        cls,
        profile: str | None = DEFAULT_PROFILE,
        config_file: str | Path | None = None,
        overrides: Sequence[str] = (),
    ) -> Config:
        """Resolve defaults ← profile ← ``config_file`` ← ``overrides`` into a validated config.

        Args:
            profile: A shipped profile name (`list_profiles`) or None for the bare defaults.
            config_file: A YAML/JSON file with any subset of the tree.
            overrides: ``"section.key=value"`` strings; values are parsed as YAML (``3``, ``true``, ``[a, b]``).

        Raises:
            ConfigError: unknown profile, unreadable file, unknown key, or invalid value.
        """
        data: dict[str, Any] = {}
        if profile is not None:
            data = _merge_layer(data, _profile_data(profile))
            data["profile"] = profile
        if config_file is not None:
            data = _merge_layer(data, read_config_file(Path(config_file)))
        for item in overrides:
            data = _merge_layer(data, parse_override(item))
        return cls.from_dict(data)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Config:
        """Validate a (partial) config tree; missing keys take their defaults.

        Raises:
            ConfigError: unknown key (naming the nearest valid one) or invalid value.
        """
        if not isinstance(data, Mapping):
            raise ConfigError(f"config: expected a mapping at the top level, got {type(data).__name__}")
        kwargs: dict[str, Any] = {}
        for key, value in data.items():
            if key in _SECTIONS:
                kwargs[key] = _build_section(key, _SECTIONS[key], value)
            elif key in _SCALARS:
                kwargs[key] = check_value(value, _SCALARS[key], key)
            else:
                raise ConfigError(unknown_key_message(str(key), _all_keys()))
        return cls(**kwargs)

    def to_dict(self) -> dict[str, Any]:
        """The resolved tree as plain YAML/JSON-able data (tuples become lists)."""
        return plain_data(attrs.asdict(self, recurse=True))

    def to_yaml(self) -> str:
        """The resolved tree as YAML (what ``mcprl-train config`` prints and every run saves)."""
        return yaml.safe_dump(self.to_dict(), sort_keys=False)

    def replace(self, overrides: Sequence[str]) -> Config:
        """A copy with ``section.key=value`` overrides applied (validated like `load`)."""
        data = self.to_dict()
        for item in overrides:
            data = _merge_layer(data, parse_override(item))
        return Config.from_dict(data)


def list_profiles() -> list[str]:
    """Names of the profiles shipped with the package."""
    root = resources.files("mcprl_train.config") / "profiles"
    return sorted(p.name.removesuffix(".yaml") for p in root.iterdir() if p.name.endswith(".yaml"))


# -- loading machinery -----------------------------------------------------------------------------------------


def _profile_data(name: str) -> dict[str, Any]:
    path = resources.files("mcprl_train.config") / "profiles" / f"{name}.yaml"
    if not path.is_file():
        known = list_profiles()
        near = difflib.get_close_matches(name, known, n=1)
        hint = f"; did you mean {near[0]!r}?" if near else ""
        raise ConfigError(f"unknown profile {name!r}{hint} (known: {', '.join(known)})")
    data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    if not isinstance(data, dict):
        raise ConfigError(f"profile {name!r}: expected a mapping")
    return data


def _merge_layer(base: Mapping[str, Any], layer: Mapping[str, Any]) -> dict[str, Any]:
    """Deep-merge ``layer`` over ``base``; a layer naming a tools source replaces the other sources.

    The earlier layers' ``tools.allow_tools`` narrowed the servers of the source being replaced, so it goes
    with it (a layer that names a source may give its own allow-lists).
    """
    tools = layer.get("tools")
    if isinstance(tools, Mapping) and isinstance(base.get("tools"), Mapping):
        chosen = [k for k in _TOOL_SOURCES if tools.get(k) is not None]
        if chosen:
            dropped = {*_TOOL_SOURCES, "allow_tools"}
            base = {**base, "tools": {k: v for k, v in base["tools"].items() if k not in dropped}}
    return deep_merge(base, layer)


def _all_keys() -> list[str]:
    keys = list(_SCALARS)
    for section, cls in _SECTIONS.items():
        keys.append(section)
        keys.extend(f"{section}.{f.name}" for f in attrs.fields(cls))
    return keys


def _build_section(section: str, cls: type, value: Any) -> Any:
    if value is None:
        return cls()
    if not isinstance(value, Mapping):
        raise ConfigError(f"{section}: expected a mapping of keys, got {value!r}")
    hints = typing.get_type_hints(cls)
    names = [f.name for f in attrs.fields(cls)]
    kwargs: dict[str, Any] = {}
    for key, item in value.items():
        path = f"{section}.{key}"
        if key not in names:
            raise ConfigError(unknown_key_message(path, [f"{section}.{n}" for n in names] + _all_keys()))
        kwargs[key] = check_value(item, hints[key], path)
    try:
        return cls(**kwargs)
    except ValueError as exc:
        raise ConfigError(f"{section}.{exc}") from exc
