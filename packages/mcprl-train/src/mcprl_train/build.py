"""Build the parts of a run from its config: policy, samplers, tool servers, environment, tasks, demos.

Everything that turns config values into objects of the other packages lives here, so the loop
(`mcprl_train.loop.trainer`) reads as wiring only.
"""

from __future__ import annotations

from operator import attrgetter
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeAlias, assert_never, cast

import structlog

from mcprl_train.errors import ConfigError, DistributedError

if TYPE_CHECKING:
    from mcprl_env import Checker, Task, TaskSet
    from mcprl_policy import Policy, PolicySampler
    from mcprl_tools import MissingVariables, ServersConfig
    from mcprl_train.config import Config
    from mcprl_train.loop.demo_file import Demonstration
    from mcprl_train.loop.task_stream import IndexedTasks
    from mcprl_train.loop.update import KLReference, TorchBackend, UpdateBackend

TaskData: TypeAlias = "tuple[TaskSet, list[Task]]"
"""The indexed training set and the fixed validation subset (`load_tasks`)."""

logger = structlog.get_logger()


def resolve_device(device: str) -> str:
    """``model.device`` with ``auto`` resolved (cuda > mps > cpu); other values as given."""
    if device != "auto":
        return device
    import torch

    return "cuda" if torch.cuda.is_available() else "mps" if torch.backends.mps.is_available() else "cpu"


def build_policy(config: Config, *, source: str | None = None) -> Policy:
    """The trainable policy (model + tokenizer + optional value head) from `config.model` / `config.lora`.

    Args:
        config: The run config.
        source: A saved policy directory to load instead of `config.model.name` (a checkpoint's `policy/`).
    """
    from mcprl_policy import Policy

    device = resolve_device(config.model.device)
    policy = Policy.from_pretrained(
        source or config.model.name,
        value_head=config.model.value_head,
        lora=config.lora,
        quantization=config.quantization,
        dtype=config.model.dtype,
        # DeepSpeed's bf16 keeps the fp32 master weights itself: the policy it wraps loads in bf16.
        master_weights=config.model.master_weights and config.distributed.backend == "none",
        device=device,
        gradient_checkpointing=config.model.gradient_checkpointing,
        attn_implementation=config.model.attn_implementation,
    )
    from mcprl_policy.attention import check_packable
    from mcprl_policy.prefix_grouped import check_prefix_groupable

    if config.optim.layout != "padded":  # neither layout runs a model with linear-attention layers
        (check_packable if config.optim.layout == "packed" else check_prefix_groupable)(policy.model)
    policy.logits_chunk_size = config.optim.logits_chunk_size
    return policy


_TINY_MODEL_SETTINGS = ("env.max_new_tokens_per_turn", "env.max_total_tokens", "optim.lr", "sft.enabled")


def tiny_profile_warning(config: Config) -> str | None:
    """What a real model inherits, unchanged, from a profile made for the embedded tiny model (or None).

    The ``cpu`` and ``mps`` profiles size turns, episodes and the learning rate for a 0.6 M-parameter model and
    warm-start it on demonstrations written for it; a real chat model given to them keeps those values unless
    the user set them.
    """
    from mcprl_policy import TINY_PRESETS
    from mcprl_train.config import Config

    if config.profile not in ("cpu", "mps") or config.model.name in TINY_PRESETS:
        return None
    profile = Config.load(profile=config.profile)
    values = [(key, attrgetter(key)) for key in _TINY_MODEL_SETTINGS]
    kept = [f"{key}={value(config)}" for key, value in values if value(config) == value(profile)]
    if not kept:
        return None
    return (
        f"profile {config.profile!r} is made for the embedded tiny model; model.name={config.model.name!r} "
        f"inherits {', '.join(kept)}: set them for this model with --set, or start from another profile "
        "(mcprl-train plan says what fits)"
    )


def torch_backend(config: Config, *, source: str | None = None) -> TorchBackend:
    """The trained policy (`build_policy`) with its update in this process (`loop.update.TorchBackend`).

    Raises:
        DistributedError: the config asks for DeepSpeed, whose backend the launched ranks build
            (`mcprl-train` launches them).
    """
    from mcprl_train.loop.update import TorchBackend

    if config.distributed.backend != "none":
        raise DistributedError(
            f"distributed.backend={config.distributed.backend}: the update runs on the ranks `mcprl-train` "
            "launches; run the config with mcprl-train, or set distributed.backend=none"
        )
    return TorchBackend(build_policy(config, source=source), config.optim)


def build_reference(config: Config, backend: UpdateBackend) -> KLReference | None:
    """The KL reference, or None when `grpo.kl_coef` is 0 (never read).

    The backend's partitioned reference where it has one (ZeRO-3), else `mcprl_policy.ReferencePolicy` of its
    sampling policy: adapters off for LoRA, a frozen full copy otherwise.
    """
    if config.grpo.kl_coef <= 0:
        return None
    if (reference := backend.partitioned_reference()) is not None:
        return reference
    from mcprl_policy import ReferencePolicy

    return ReferencePolicy.for_policy(backend.sampling_policy, layout=config.optim.layout)


def build_sampler(
    config: Config,
    policy: Policy,
    *,
    greedy: bool = False,
    seed: int | None = None,
    backend: UpdateBackend | None = None,
) -> PolicySampler:
    """The rollout sampler (`config.sampling`, `config.sampler`); `greedy` gives the evaluation sampler.

    `seed` is the sampler's (derived from `run.seed` by the caller; `sampling.seed` is never set). A vLLM
    sampler pushes ``policy``'s weights gathered by `backend`'s `UpdateBackend.weight_gather` where it has one.
    """
    import attrs

    from mcprl_policy import HFSampler, SamplingParams

    params = (
        SamplingParams(temperature=0.0, seed=seed) if greedy else attrs.evolve(config.sampling, seed=seed)
    )
    match config.sampler.backend:
        case "hf":
            return HFSampler(
                policy,
                params,
                max_batch_size=config.sampler.max_batch_size,
                max_wait_ms=config.sampler.max_wait_ms,
                prefix_cache_mb=config.sampler.prefix_cache_mb,
                decode_forward=config.sampler.decode_forward,
            )
        case "vllm":
            from mcprl_policy import MissingExtraError
            from mcprl_policy.vllm_sampler import VLLMSampler, require_vllm

            try:
                require_vllm()
            except MissingExtraError as exc:
                raise ConfigError(f"sampler.backend=vllm: {exc}; or use sampler.backend=hf") from exc
            from mcprl_policy.weight_push import LOCAL_PARAMETERS

            gather = backend.weight_gather() if backend is not None else None
            # The rollout and the greedy evaluation sampler share one engine (same settings); it pulls the
            # policy's weights before generating whenever they changed (SFT, GRPO updates, a restore).
            return VLLMSampler(
                policy,
                params,
                max_batch_size=config.sampler.max_batch_size,
                max_wait_ms=config.sampler.max_wait_ms,
                gpu_memory_utilization=config.sampler.gpu_memory_utilization,
                sleep_mode=config.sampler.vllm_sleep,
                engine_kwargs={"max_num_seqs": config.sampler.max_batch_size},
                weight_gather=gather if gather is not None else LOCAL_PARAMETERS,
                push_bucket_bytes=int(config.sampler.vllm_push_bucket_mb * 2**20),
            )
        case _ as unreachable:
            assert_never(unreachable)


def servers_config(config: Config, *, missing_variables: MissingVariables = "raise") -> ServersConfig:
    """The `mcprl_tools.ServersConfig` of `config.tools` (a file, an inline mapping or bundled servers).

    `tools.allow_tools` narrows the named servers' exposed tools on top of whichever source is used;
    `missing_variables` is `mcprl_tools.ServersConfig.from_dict`'s.

    Raises:
        ValueError: `tools.allow_tools` names a server the source does not start.
    """
    import attrs

    from mcprl_tools import ServersConfig
    from mcprl_train.config import InlineServers, OfflineServers, ServersFile

    tools = config.tools
    match tools.source:
        case ServersFile(path=path):
            servers = ServersConfig.load(path, missing_variables=missing_variables)
        case InlineServers(servers=inline) as source:
            source.require_secrets()
            servers = ServersConfig.from_dict(
                {"mcpServers": dict(inline)}, source="<config>", missing_variables=missing_variables
            )
        case OfflineServers(names=names):
            from mcprl_servers.config import default_servers_config

            servers = ServersConfig.from_dict(
                default_servers_config(list(names)),
                source="<offline servers>",
                missing_variables=missing_variables,
            )
    if not tools.allow_tools:
        return servers
    unknown = sorted(set(tools.allow_tools) - set(servers.servers))
    if unknown:
        raise ValueError(f"tools.allow_tools names servers that are not configured: {unknown}")
    narrowed = {
        name: attrs.evolve(server, allow_tools=tuple(tools.allow_tools[name]))
        if name in tools.allow_tools
        else server
        for name, server in servers.servers.items()
    }
    return attrs.evolve(servers, servers=narrowed)


def task_path(spec: str, *, name: str) -> Path:
    """The file behind a task spec.

    `spec` is a path, or `preset:<preset>` (the bundled `mcprl_tasks` preset's split `name`), or
    `preset:<preset>-train` / `preset:<preset>-validation` naming the split explicitly.
    """
    if spec.startswith("preset:"):
        import mcprl_tasks

        preset, split = spec.removeprefix("preset:"), name
        for suffix in ("train", "validation"):
            if preset.endswith(f"-{suffix}"):
                preset, split = preset.removesuffix(f"-{suffix}"), suffix
        train, validation = mcprl_tasks.load_preset(preset)
        return validation if split == "validation" else train
    path = Path(spec)
    if not path.is_file():
        raise FileNotFoundError(f"{name} task file {spec!r} does not exist")
    return path


def default_checker(config: Config) -> Checker | None:
    """The checker of `tasks.checker` (imported now, so a typo fails at start-up), or None.

    Raises:
        ConfigError: the function cannot be imported or found (the error names the file).
    """
    from mcprl_env import TaskValidationError, checker_from_dict

    if config.tasks.checker is None:
        return None
    try:
        return checker_from_dict({"type": "python", "function": config.tasks.checker})
    except TaskValidationError as exc:
        raise ConfigError(f"tasks.checker: {exc.reason}") from exc


def load_task_source(spec: str, *, name: str, checker: Checker | None = None) -> TaskSet:
    """An indexed, streaming `mcprl_env.TaskSet` of a task spec (see `task_path`).

    `checker` is the checker of the tasks that name none (`default_checker`).
    """
    from mcprl_env import TaskSet

    tasks = TaskSet(task_path(spec, name=name), default_checker=checker)
    tasks.build_index()
    return tasks


def load_tasks(config: Config) -> TaskData:
    """The training set (indexed, validated) and the fixed validation subset (empty without validation).

    Raises:
        FileNotFoundError: a task file does not exist.
        mcprl_env.TaskValidationError: a task does not match the schema, or two share an id (with the lines).
        ConfigError: the training set has fewer tasks than a step takes (`grpo.tasks_per_step`).
    """
    checker = default_checker(config)
    train = load_task_source(config.tasks.train, name="train", checker=checker)
    if len(train) < config.grpo.tasks_per_step:
        raise ConfigError(
            f"grpo.tasks_per_step={config.grpo.tasks_per_step}: the training set {config.tasks.train!r} has "
            f"only {len(train)} tasks (a step takes that many distinct tasks)"
        )
    return train, validation_tasks(config, checker=checker)


def validation_tasks(config: Config, *, checker: Checker | None) -> list[Task]:
    """The fixed validation subset: the first `eval.n_tasks` tasks of `tasks.validation` (none when null);
    `checker` as in `load_task_source`."""
    if config.tasks.validation is None:
        return []
    validation = load_task_source(config.tasks.validation, name="validation", checker=checker)
    return first_tasks(validation, config.eval.n_tasks)


def load_demos(config: Config) -> list[Demonstration]:
    """The warm-start demonstrations: the lines of `sft.demos_path` (`mcprl_train.loop.demo_file`), and/or
    scripted ones (`scripted_demos`), as `mcprl_train.config.SFTConfig` says.

    Raises:
        FileNotFoundError: `sft.demos_path` does not exist.
        DemonstrationError: a line of `sft.demos_path` is malformed (its line number and the problem).
        ConfigError: only scripted demonstrations are asked for and no training task has one.
    """
    from mcprl_train.loop.demo_file import read_demo_file

    path = task_path(config.tasks.train, name="train")
    if config.sft.demos_path is None:
        return scripted_demos(config, path)
    import mcprl_tasks

    ids = {str(t.get("id")) for t in mcprl_tasks.read_tasks(path)}
    demos = read_demo_file(Path(config.sft.demos_path), ids)
    if config.sft.add_scripted:
        demos += scripted_demos(config, path, required=False)
    return demos


def scripted_demos(config: Config, path: Path, *, required: bool = True) -> list[Demonstration]:
    """`sft.demos` scripted demonstrations of training tasks of the bundled families (`mcprl_tasks.FAMILIES`).

    Each comes from `mcprl_tasks.imperfect_teacher` (at its family's teacher noise) or `mcprl_tasks.ideal_demo`
    seeded by `run.seed`, in a fixed seeded order of the tasks (`mcprl_tasks.plan_demos` sets each family's
    share): the demonstration set is the same in every run. Tool calls are structured `tool_calls`, rendered
    by the model's chat template in its own format; with ``env.chat_template_kwargs.enable_thinking`` each
    assistant turn carries a one-line ``reasoning_content`` (`mcprl_tasks.with_reasoning`). Tasks of other
    families (a user's own) are left to GRPO alone.

    Raises:
        ConfigError: `required` and no training task belongs to a family with demonstrations, or
            `sft.family_weights` / `sft.family_noise` name a family without such tasks or ask for more of a
            family's tasks than the training set holds.
    """
    import random

    import mcprl_tasks
    from mcprl_train.loop.demo_file import Demonstration

    raw = mcprl_tasks.read_tasks(path)
    rng = random.Random(f"demos:{config.run.seed}")
    order = list(range(len(raw)))
    rng.shuffle(order)
    scripted = [i for i in order if _family(raw[i]) in mcprl_tasks.FAMILIES]
    if not scripted and required:
        families = sorted({str(_family(t)) for t in raw})
        raise ConfigError(
            f"sft.enabled: no task in {str(path)!r} has a scripted demonstration (its families: "
            f"{', '.join(families)}; demonstrations exist for {', '.join(sorted(mcprl_tasks.FAMILIES))}); "
            "give demonstrations with sft.demos_path, or set sft.enabled=false to train with GRPO alone"
        )
    try:
        plan = mcprl_tasks.plan_demos(
            [str(_family(raw[i])) for i in scripted],
            config.sft.demos,
            teacher_noise=config.sft.teacher_noise,
            weights=config.sft.family_weights,
            noise_by_family=config.sft.family_noise,
        )
    except mcprl_tasks.TasksError as e:
        raise ConfigError(f"sft.family_weights / sft.family_noise: {e}") from e
    out: list[Demonstration] = []
    for planned in plan:
        task = raw[scripted[planned.position]]
        if rng.random() < planned.teacher_noise:
            messages = mcprl_tasks.imperfect_teacher(task, rng, p_typo=config.sft.teacher_typos)
        else:
            messages = mcprl_tasks.ideal_demo(task)
        if config.env.chat_template_kwargs.get("enable_thinking") is True:
            messages = mcprl_tasks.with_reasoning(messages)  # rendered in the think block before each turn
        succeeds = bool(mcprl_tasks.demo_succeeds(task, messages))
        out.append(
            Demonstration(task_id=str(task["id"]), messages=messages, succeeds=succeeds, source="scripted")
        )
    return out


def _family(task: dict[str, Any]) -> object:
    metadata: object = task.get("metadata")
    return cast("dict[str, object]", metadata).get("family") if isinstance(metadata, dict) else None


def first_tasks(tasks: IndexedTasks, n: int) -> list[Task]:
    """The first `n` tasks of a set (fixed validation subset)."""
    return [tasks.task_at(i) for i in range(min(n, len(tasks)))]
