"""Memory preflight: will a profile's model, optimizer, activations and sampler fit its devices?

`load_model_shape` finds the model's architecture without the network (the hub is never contacted);
`plan_memory` applies the memory model (`mcprl_train.commands.memory`, written down in the README) for the
config's device, and `render_plan` prints it per device with the formula of every row and when it is live.
These are estimates for a go/no-go answer before allocation, not a profiler; fragmentation and kernel
workspaces add a few percent.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from rich.table import Table

from mcprl_train import build
from mcprl_train.commands.architectures import KNOWN_ARCHITECTURES
from mcprl_train.commands.memory import GIB, MemoryPlan, MemoryRow, estimate_memory
from mcprl_train.commands.shape import ModelShape
from mcprl_train.config import Config
from mcprl_train.errors import PlanError

if TYPE_CHECKING:
    from transformers import PretrainedConfig

__all__ = ["MemoryPlan", "MemoryRow", "ModelShape", "load_model_shape", "plan_memory", "render_plan"]


def load_model_shape(name: str) -> ModelShape:
    """The shape of ``name``, looked up in this order: the embedded tiny presets, the shipped table of common
    models (`mcprl_train.commands.architectures`; a built-in pretrained model such as ``smollm2-135m`` is the
    published model it converts), a local directory's ``config.json``, the Hugging Face cache.

    Raises:
        PlanError: none of them has it (the message says how to provide the config), or its config is not a
            dense decoder's.
    """
    from mcprl_policy.pinned_models import PINNED_MODELS
    from mcprl_policy.tiny import TINY_PRESETS

    if name in PINNED_MODELS:
        name = PINNED_MODELS[name].hub_id
    if name in TINY_PRESETS:
        p = TINY_PRESETS[name]
        return ModelShape(
            vocab_size=p.vocab_size,
            hidden_size=p.hidden_size,
            intermediate_size=p.intermediate_size,
            num_layers=p.num_hidden_layers,
            num_heads=p.num_attention_heads,
            num_kv_heads=p.num_key_value_heads,
            head_dim=p.hidden_size // p.num_attention_heads,
            max_position_embeddings=p.max_position_embeddings,
            source=f"embedded preset {name!r}",
        )
    if name in KNOWN_ARCHITECTURES:
        return KNOWN_ARCHITECTURES[name]
    path = Path(name).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise PlanError(f"cannot read the model config of {name!r}: the directory has no config.json")
        return _shape_from_config_dir(path, name)
    if path.exists():
        raise PlanError(
            f"cannot read the model config of {name!r}: not a directory (pass the model's folder)"
        )
    cached = _cached_config(name)
    if cached is None:
        known = ", ".join(sorted(KNOWN_ARCHITECTURES))
        raise PlanError(
            f"cannot read the model config of {name!r}: it is not in plan's table ({known}), not a local "
            "directory and not in the Hugging Face cache (plan never downloads); fetch just its config with "
            f"`hf download {name} config.json` or pass a directory holding its config.json with --model"
        )
    return _shape_from_config_dir(cached.parent, name)


def _cached_config(name: str) -> Path | None:
    from huggingface_hub import try_to_load_from_cache
    from huggingface_hub.errors import HFValidationError

    try:
        found = try_to_load_from_cache(name, "config.json")
    except HFValidationError:  # not a repo id either (e.g. a mistyped path)
        return None
    return Path(found) if isinstance(found, str) else None


def _shape_from_config_dir(directory: Path, name: str) -> ModelShape:
    try:
        cfg = _auto_config(directory)
    except (OSError, ValueError, KeyError) as exc:
        raise PlanError(
            f"cannot read the model config of {name!r} ({directory / 'config.json'}): {exc}"
        ) from exc
    text_cfg: PretrainedConfig = getattr(cfg, "text_config", None) or cfg
    try:
        return ModelShape.from_hf_config(text_cfg, source=str(directory / "config.json"))
    except AttributeError as exc:
        raise PlanError(f"{name!r} is not a decoder-only language model config ({exc})") from exc


def _auto_config(directory: Path) -> PretrainedConfig:
    from transformers import AutoConfig

    # transformers leaves AutoConfig.from_pretrained's **kwargs (and so its return type) unannotated.
    return AutoConfig.from_pretrained(str(directory), local_files_only=True)  # pyright: ignore[reportUnknownMemberType, reportUnknownVariableType]


def plan_memory(config: Config, shape: ModelShape, *, device_memory: int | None = None) -> MemoryPlan:
    """Estimate the peak memory per device of training ``config``'s model with shape ``shape``.

    Args:
        config: The resolved config.
        shape: The model's shape (`load_model_shape`).
        device_memory: Bytes per device; default ``distributed.device_memory_gb`` or the local device.
    """
    device = build.resolve_device(config.model.device).partition(":")[0]
    n = config.distributed.num_gpus if config.distributed.backend == "deepspeed" else 1
    memory = device_memory if device_memory is not None else _device_memory(config, device, n)
    return estimate_memory(config, shape, device=device, device_memory=memory)


def _device_memory(config: Config, device: str, n: int) -> int | None:
    if config.distributed.device_memory_gb is not None:
        return int(config.distributed.device_memory_gb * GIB)
    if device == "cuda":
        import torch

        if not torch.cuda.is_available():
            return None
        # torch leaves get_device_properties' return type unannotated (a _CudaDeviceProperties).
        return int(torch.cuda.get_device_properties(0).total_memory)  # pyright: ignore[reportUnknownMemberType, reportUnknownArgumentType]
    try:  # cpu and mps share the host memory
        host = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None
    return host // n


def _gib(nbytes: int) -> str:
    return f"{nbytes / GIB:,.2f} GiB"


def render_plan(plan: MemoryPlan) -> Table:
    """The plan as a rich table (one row per component with its formula, total, available, verdict)."""
    title = (
        f"{plan.model}: {plan.shape.num_params / 1e6:,.1f} M params, {plan.trainable_params / 1e6:,.2f} M trainable"
        f" — per {plan.device} device (× {plan.num_devices})"
    )
    table = Table(title=title, caption=f"architecture: {plan.shape.source}" if plan.shape.source else None)
    table.add_column("component")
    table.add_column("live", style="dim")
    table.add_column("per device", justify="right")
    table.add_column("formula", style="dim")
    for row in plan.rows:
        table.add_row(row.name, row.phase, _gib(row.nbytes), row.formula)
    update, sampling = _gib(plan.phase_bytes("update")), _gib(plan.phase_bytes("sampling"))
    phases = (
        f"update {update} + sampling {sampling} (collection.overlap: at once)"
        if plan.overlapped
        else f"max(update {update}, sampling {sampling})"
    )
    table.add_row("[bold]peak[/bold]", "", f"[bold]{_gib(plan.total)}[/bold]", f"resident + {phases}")
    if plan.device_memory is None:
        table.add_row("device memory", "", "unknown", "set distributed.device_memory_gb")
    else:
        verdict = "[green]fits[/green]" if plan.fits else "[red]does not fit[/red]"
        table.add_row("device memory", "", _gib(plan.device_memory), "")
        table.add_row("verdict", "", verdict, f"{_gib(plan.headroom or 0)} headroom")
    for note in plan.notes:
        table.add_row("[dim]note[/dim]", "", "", note)
    return table
