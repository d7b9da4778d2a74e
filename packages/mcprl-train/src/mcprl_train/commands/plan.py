"""Memory preflight: will a profile's model, optimizer, activations and sampler fit its devices?

`plan_memory` estimates the peak memory of one device from the model's config alone (nothing is allocated,
no weights are read): the embedded tiny preset for ``"tiny"``, ``AutoConfig`` for a local directory or a
cached hub model. The estimate, per device of ``N`` (``distributed.num_gpus`` under DeepSpeed, else 1):

- weights: every parameter at the model dtype (NF4: linear layers at 0.5 byte + one fp32 absmax per 64
  weights), LoRA adapters in fp32; ZeRO-3 partitions them (/N) and keeps one gathered layer (or the
  embedding, whichever is larger) live.
- gradients: trainable parameters at the model dtype (adapters: fp32); /N from ZeRO-2.
- optimizer: AdamW's two moments — fp32 plus fp32 master weights under DeepSpeed mixed precision
  (Rajbhandari et al. 2020, "ZeRO", K = 12 bytes/parameter), at the parameter dtype with a plain torch
  AdamW; /N from ZeRO-1.
- reference policy: a frozen full copy for full fine-tuning with KL (/N under ZeRO-3); LoRA disables the
  adapters instead (no copy).
- activations for ``optim.micro_batch_tokens`` packed tokens, with memory-efficient attention (no s²
  scores): per layer and token, the layer input, the normalised inputs, q/k/v, the attention output and
  the MLP's gate/up/product (Korthikanti et al. 2022 with SwiGLU and GQA). Gradient checkpointing keeps
  only each layer's input plus one layer being recomputed.
- logits: one chunk of 1024 tokens × vocabulary in fp32 (logits, log-softmax, gradient) — mcprl-policy's
  chunked packed forward.
- sampler: the HF sampler's KV cache for ``sampler.max_batch_size`` sequences of ``env.max_total_tokens``,
  plus its cross-turn prefix cache (``sampler.prefix_cache_mb``, a budget it never exceeds);
  the vLLM backend instead reserves ``sampler.gpu_memory_utilization`` of the device.
- CUDA context: a fixed 0.5 GiB on CUDA devices.

These are estimates for a go/no-go answer before allocation, not a profiler; fragmentation and kernel
workspaces add a few percent.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

import attrs
from rich.table import Table

from mcprl_train.config import Config
from mcprl_train.errors import PlanError

if TYPE_CHECKING:
    from transformers import PretrainedConfig

__all__ = ["MemoryPlan", "ModelShape", "load_model_shape", "plan_memory", "render_plan"]

GIB = 1024**3
LOGITS_CHUNK_TOKENS = 1024
CUDA_CONTEXT_BYTES = GIB // 2
NF4_BYTES_PER_PARAM = 0.5 + 4 / 64
_DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
_DEFAULT_LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@attrs.frozen(kw_only=True)
class ModelShape:
    """The sizes of a decoder-only (Qwen/Llama-style) model that determine its memory."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    tie_embeddings: bool = True
    attention_bias: bool = False
    qk_norm: bool = True

    @property
    def q_dim(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.num_kv_heads * self.head_dim

    def linear_shapes(self) -> dict[str, tuple[int, int]]:
        """``module name → (in_features, out_features)`` of one decoder layer's linear layers."""
        h, i = self.hidden_size, self.intermediate_size
        return {
            "q_proj": (h, self.q_dim),
            "k_proj": (h, self.kv_dim),
            "v_proj": (h, self.kv_dim),
            "o_proj": (self.q_dim, h),
            "gate_proj": (h, i),
            "up_proj": (h, i),
            "down_proj": (i, h),
        }

    @property
    def layer_linear_params(self) -> int:
        weights = sum(a * b for a, b in self.linear_shapes().values())
        bias = (self.q_dim + 2 * self.kv_dim) if self.attention_bias else 0
        return weights + bias

    @property
    def layer_params(self) -> int:
        norms = 2 * self.hidden_size + (2 * self.head_dim if self.qk_norm else 0)
        return self.layer_linear_params + norms

    @property
    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size

    @property
    def num_params(self) -> int:
        head = 0 if self.tie_embeddings else self.embedding_params
        return self.embedding_params + self.num_layers * self.layer_params + self.hidden_size + head

    def lora_params(self, r: int, targets: tuple[str, ...] = ()) -> int:
        """Adapter parameters: ``r · (in + out)`` per targeted module per layer."""
        shapes = self.linear_shapes()
        chosen = targets or _DEFAULT_LORA_TARGETS
        unknown = [t for t in chosen if t not in shapes]
        if unknown:
            raise PlanError(
                f"lora.target_modules {unknown} are not linear layers of this model ({sorted(shapes)})"
            )
        return self.num_layers * sum(r * (shapes[t][0] + shapes[t][1]) for t in chosen)

    @classmethod
    def from_hf_config(cls, cfg: PretrainedConfig) -> ModelShape:
        """From a transformers ``PretrainedConfig`` (Qwen2/3, Llama, Mistral field names)."""
        hidden = int(cfg.hidden_size)
        heads = int(cfg.num_attention_heads)
        head_dim = getattr(cfg, "head_dim", None) or hidden // heads
        return cls(
            vocab_size=int(cfg.vocab_size),
            hidden_size=hidden,
            intermediate_size=int(cfg.intermediate_size),
            num_layers=int(cfg.num_hidden_layers),
            num_heads=heads,
            num_kv_heads=int(getattr(cfg, "num_key_value_heads", None) or heads),
            head_dim=int(head_dim),
            tie_embeddings=bool(getattr(cfg, "tie_word_embeddings", False)),
            attention_bias=bool(getattr(cfg, "attention_bias", False)),
            qk_norm=getattr(cfg, "model_type", "") == "qwen3",
        )


def load_model_shape(name: str) -> ModelShape:
    """The shape of ``name``: an embedded tiny preset, a local directory or a hub id already in the cache.

    Raises:
        PlanError: the config cannot be read (not cached and no network, or not a decoder config).
    """
    from mcprl_policy.tiny import TINY_PRESETS

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
        )
    try:
        cfg = _auto_config(name, local_files_only=True)
    except (OSError, ValueError) as cached_exc:
        if Path(name).exists() or os.environ.get("HF_HUB_OFFLINE") == "1":
            raise PlanError(f"cannot read the model config of {name!r}: {cached_exc}") from cached_exc
        try:
            cfg = _auto_config(name, local_files_only=False)
        except (OSError, ValueError) as exc:
            raise PlanError(
                f"cannot read the model config of {name!r}: it is not in the Hugging Face cache and the hub "
                f"is unreachable ({exc}); pass a local model directory with --model"
            ) from exc
    text_cfg: PretrainedConfig = getattr(cfg, "text_config", None) or cfg
    try:
        return ModelShape.from_hf_config(text_cfg)
    except AttributeError as exc:
        raise PlanError(f"{name!r} is not a decoder-only language model config ({exc})") from exc


def _auto_config(name: str, *, local_files_only: bool) -> PretrainedConfig:
    from transformers import AutoConfig

    # transformers leaves AutoConfig.from_pretrained's **kwargs (and so its return type) unannotated.
    return AutoConfig.from_pretrained(name, local_files_only=local_files_only)  # pyright: ignore[reportUnknownMemberType, reportUnknownVariableType]


@attrs.frozen(kw_only=True)
class MemoryPlan:
    """Per-device memory estimate of a config (bytes) and the verdict.

    Attributes:
        rows: ``component → bytes per device`` in display order.
        device: Device kind the estimate is for.
        num_devices: Devices the model is spread over.
        device_memory: Bytes available per device (None: unknown).
        reserved: Bytes reserved by a co-located vLLM sampler.
        notes: Assumptions worth showing next to the table.
    """

    model: str
    shape: ModelShape
    trainable_params: int
    rows: dict[str, int]
    device: str
    num_devices: int
    device_memory: int | None
    reserved: int = 0
    notes: tuple[str, ...] = ()

    @property
    def total(self) -> int:
        return sum(self.rows.values()) + self.reserved

    @property
    def fits(self) -> bool | None:
        return None if self.device_memory is None else self.total <= self.device_memory

    @property
    def headroom(self) -> int | None:
        return None if self.device_memory is None else self.device_memory - self.total


def plan_memory(config: Config, shape: ModelShape, *, device_memory: int | None = None) -> MemoryPlan:
    """Estimate the peak memory per device of training ``config``'s model with shape ``shape``.

    Args:
        config: The resolved config (model dtype, LoRA, quantization, ZeRO stage, micro-batch, sampler).
        shape: The model's shape (`load_model_shape`).
        device_memory: Bytes per device; default ``distributed.device_memory_gb`` or the local device.
    """
    ds = config.distributed
    n = ds.num_gpus if ds.backend == "deepspeed" else 1
    stage = ds.zero_stage if ds.backend == "deepspeed" else 0
    device = _device_kind(config.model.device)
    wbytes = _DTYPE_BYTES[config.model.dtype]
    total_params = shape.num_params
    lora = config.lora is not None
    trainable = (
        shape.lora_params(config.lora.r, config.lora.target_modules or ()) if config.lora else total_params
    )
    rows: dict[str, int] = {}
    notes: list[str] = []

    if config.quantization is not None:  # nf4 and fp4 both store 4 bits + an fp32 absmax per 64
        linear = shape.num_layers * shape.layer_linear_params
        base = round(linear * NF4_BYTES_PER_PARAM) + (total_params - linear) * wbytes
        notes.append(
            f"base model in {config.quantization.upper()} (bitsandbytes): linear layers at 0.5 byte + fp32 "
            "absmax per 64"
        )
    else:
        base = total_params * wbytes
    rows["weights"] = base // n if stage == 3 else base
    if stage == 3:
        rows["zero3 gathered params"] = max(shape.layer_params, shape.embedding_params) * wbytes
    if lora:
        rows["lora adapters (fp32)"] = trainable * 4

    grad_bytes = 4 if lora else wbytes
    rows["gradients"] = _shard(trainable * grad_bytes, n, stage >= 2)
    mixed = ds.backend == "deepspeed" and (ds.bf16 or wbytes == 2)
    state_bytes = 4 if (lora or mixed) else wbytes
    optimizer = trainable * 2 * state_bytes + (trainable * 4 if mixed and not lora else 0)
    rows["optimizer states"] = _shard(optimizer, n, stage >= 1)
    if not lora and (config.grpo.kl_coef > 0 or config.grpo.kl_in_reward):
        rows["reference policy"] = _shard(total_params * wbytes, n, stage == 3)

    rows["activations"] = _activation_bytes(config, shape)
    rows["logits chunk"] = LOGITS_CHUNK_TOKENS * shape.vocab_size * 4 * 3
    reserved = 0
    memory = device_memory if device_memory is not None else _device_memory(config, device, n)
    match config.sampler.backend:
        case "hf":
            rows["sampler kv cache"] = (
                config.sampler.max_batch_size
                * config.env.max_total_tokens
                * 2
                * shape.num_layers
                * shape.kv_dim
                * wbytes
            )
            if config.sampler.prefix_cache_mb > 0:
                rows["sampler prefix cache"] = int(config.sampler.prefix_cache_mb * 2**20)
        case "vllm":
            if memory is not None:
                reserved = int(memory * config.sampler.gpu_memory_utilization)
            notes.append(f"vLLM reserves {config.sampler.gpu_memory_utilization:.0%} of the device")
    if device == "cuda":
        rows["cuda context"] = CUDA_CONTEXT_BYTES
    if device == "cpu" and n > 1:
        notes.append(f"{n} processes share the host memory: each gets 1/{n}")
    return MemoryPlan(
        model=config.model.name,
        shape=shape,
        trainable_params=trainable,
        rows=rows,
        device=device,
        num_devices=n,
        device_memory=memory,
        reserved=reserved,
        notes=tuple(notes),
    )


def _shard(nbytes: int, n: int, partitioned: bool) -> int:
    return nbytes // n if partitioned else nbytes


def _activation_bytes(config: Config, shape: ModelShape) -> int:
    tokens = config.optim.micro_batch_tokens
    act = _DTYPE_BYTES[config.model.dtype]
    h, i = shape.hidden_size, shape.intermediate_size
    # per token: layer input + 2 normalised inputs, q/k/v, attention output, gate/up/act(gate)*up
    per_layer_token = act * (3 * h + shape.q_dim + 2 * shape.kv_dim + shape.q_dim + 3 * i)
    if config.model.gradient_checkpointing:
        return tokens * (shape.num_layers * h * act + per_layer_token)
    return tokens * shape.num_layers * per_layer_token


def _device_kind(device: str) -> str:
    base = device.partition(":")[0]
    if base != "auto":
        return base
    import torch

    if torch.cuda.is_available():
        return "cuda"
    return "mps" if torch.backends.mps.is_available() else "cpu"


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
    """The plan as a rich table (one row per component, total, available, verdict)."""
    title = (
        f"{plan.model}: {plan.shape.num_params / 1e6:,.1f} M params, {plan.trainable_params / 1e6:,.2f} M trainable"
        f" — per {plan.device} device (× {plan.num_devices})"
    )
    table = Table(title=title)
    table.add_column("component")
    table.add_column("per device", justify="right")
    for name, nbytes in plan.rows.items():
        table.add_row(name, _gib(nbytes))
    if plan.reserved:
        table.add_row("vLLM share (reserved)", _gib(plan.reserved))
    table.add_row("[bold]total[/bold]", f"[bold]{_gib(plan.total)}[/bold]")
    if plan.device_memory is None:
        table.add_row("device memory", "unknown (set distributed.device_memory_gb)")
    else:
        verdict = "[green]fits[/green]" if plan.fits else "[red]does not fit[/red]"
        table.add_row("device memory", _gib(plan.device_memory))
        table.add_row("verdict", f"{verdict} ({_gib(plan.headroom or 0)} headroom)")
    for note in plan.notes:
        table.add_row("[dim]note[/dim]", f"[dim]{note}[/dim]")
    return table
