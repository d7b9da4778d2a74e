"""The memory model of `mcprl-train plan`: peak bytes per device of training a config's model.

The formulas, their symbols and their sources (Rajbhandari et al. 2020, "ZeRO", §3; Korthikanti et al. 2022,
§4) are written down in the mcprl-train README ("Memory model"); each row of a `MemoryPlan` carries its
formula with the config's numbers filled in (the per-token sizes: `mcprl_train.commands.activations`). The
peak is the resident rows plus the larger of the update phase and the sampling phase (`MemoryRow.phase`), or
plus both under ``collection.overlap``, which runs them at once.
"""

from __future__ import annotations

from typing import Literal, assert_never

import attrs

from mcprl_train.commands.activations import (
    DTYPE_BYTES,
    is_mixed,
    layer_activation_bytes,
    master_bytes,
    model_activation_bytes,
    stream_bytes,
)
from mcprl_train.commands.shape import ModelShape
from mcprl_train.config import Config

__all__ = ["GIB", "MemoryPlan", "MemoryRow", "Phase", "estimate_memory", "layer_activation_bytes"]

Phase = Literal["resident", "update", "sampling"]
GIB = 1024**3
CUDA_CONTEXT_BYTES = GIB // 2
# 4 bits + double-quantised absmax: one int8 per 64-weight block and one fp32 per 256 blocks (Dettmers et al.
# 2023, "QLoRA", §3 "Double Quantization": 8/64 + 32/(64·256) bits per parameter).
NF4_BYTES_PER_PARAM = 0.5 + 1 / 64 + 4 / (64 * 256)


@attrs.frozen(kw_only=True)
class MemoryRow:
    """One component of the estimate: its bytes per device, the formula that gave them, when it is live.

    ``resident`` rows stay allocated for the whole run; ``update`` rows only while the learner runs its
    forward/backward and optimizer step; ``sampling`` rows only while rollouts are generated. A GRPO step
    collects, then learns, so the two phases never overlap, unless ``collection.overlap`` (`MemoryPlan.overlapped`).
    """

    name: str
    nbytes: int
    formula: str
    phase: Phase = "resident"


@attrs.frozen(kw_only=True)
class MemoryPlan:
    """Per-device memory estimate of a config (bytes) and the verdict.

    Attributes:
        rows: The components in display order (the vLLM share is one when the sampler is vLLM).
        device: Device kind the estimate is for.
        num_devices: Devices the model is spread over.
        device_memory: Bytes available per device (None: unknown).
        notes: Assumptions worth showing next to the table.
        overlapped: The update runs while the next step is collected (``collection.overlap``): both phases are
            live at once.
    """

    model: str
    shape: ModelShape
    trainable_params: int
    rows: tuple[MemoryRow, ...]
    device: str
    num_devices: int
    device_memory: int | None
    notes: tuple[str, ...] = ()
    overlapped: bool = False

    def bytes_of(self) -> dict[str, int]:
        """``component → bytes per device``."""
        return {row.name: row.nbytes for row in self.rows}

    def phase_bytes(self, phase: Phase) -> int:
        """Bytes of the rows live only in ``phase`` (or resident throughout)."""
        return sum(row.nbytes for row in self.rows if row.phase == phase)

    @property
    def total(self) -> int:
        """The peak: resident rows plus the larger of the update and the sampling phase (both when overlapped)."""
        update, sampling = self.phase_bytes("update"), self.phase_bytes("sampling")
        return self.phase_bytes("resident") + (
            update + sampling if self.overlapped else max(update, sampling)
        )

    @property
    def fits(self) -> bool | None:
        return None if self.device_memory is None else self.total <= self.device_memory

    @property
    def headroom(self) -> int | None:
        return None if self.device_memory is None else self.device_memory - self.total


def _m(n: int) -> str:
    return f"{n / 1e6:,.1f}M"


def estimate_memory(
    config: Config, shape: ModelShape, *, device: str, device_memory: int | None
) -> MemoryPlan:
    """Estimate the peak memory per device of training ``config``'s model with shape ``shape``.

    Args:
        config: The resolved config (model dtype, LoRA, quantization, ZeRO stage, micro-batch, sampler).
        shape: The model's shape (`mcprl_train.commands.plan.load_model_shape`).
        device: ``cuda``, ``mps`` or ``cpu``: the CUDA context is counted on ``cuda`` only.
        device_memory: Bytes per device, None when unknown (a vLLM share then cannot be sized).
    """
    n, _ = _zero(config)
    w = DTYPE_BYTES[config.model.dtype]
    lora = config.lora
    t = shape.lora_params(lora.r, lora.target_modules or ()) if lora else shape.num_params
    notes: list[str] = []
    rows = [*_weight_rows(config, shape, w, t), *_update_rows(config, w, t), *_copy_rows(config, shape, w, t)]
    rows.extend(_autocast_rows(config, shape, w, t))
    rows.extend(_activation_rows(config, shape, w, device))
    rows.extend(_sampler_rows(config, shape, w, device_memory))
    if config.sampler.backend == "vllm":
        notes.append(
            "vLLM's share holds its own copy of the weights and its KV cache"
            if device_memory is not None
            else "vLLM's share is unknown: set distributed.device_memory_gb"
        )
    if device == "cuda":
        rows.append(MemoryRow(name="cuda context", nbytes=CUDA_CONTEXT_BYTES, formula="0.5 GiB"))
    if shape.gated_delta_net is not None:
        notes.append(
            "linear-attention layers' activations are estimated from fla's kernel inputs, not measured"
        )
    if device == "cpu" and n > 1:
        notes.append(f"{n} processes share the host memory: each gets 1/{n}")
    return MemoryPlan(
        model=config.model.name,
        shape=shape,
        trainable_params=t,
        rows=tuple(rows),
        device=device,
        num_devices=n,
        device_memory=device_memory,
        notes=tuple(notes),
        overlapped=config.collection.overlap,
    )


def _zero(config: Config) -> tuple[int, int]:
    """``(N, z)``: ranks the model is spread over and the ZeRO stage (0 without DeepSpeed)."""
    ds = config.distributed
    return (ds.num_gpus, ds.zero_stage) if ds.backend == "deepspeed" else (1, 0)


def _weight_rows(config: Config, shape: ModelShape, w: int, t: int) -> list[MemoryRow]:
    n, stage = _zero(config)
    base, base_formula = _base_weights(config, shape, w if config.lora else master_bytes(config))
    rows: list[MemoryRow] = []
    if stage == 3:
        rows.append(MemoryRow(name="weights", nbytes=base // n, formula=f"({base_formula}) / {n} ranks"))
        gathered = max(shape.layer_params, shape.embedding_params) + _prefetch_bucket(config)
        rows.append(
            MemoryRow(
                name="zero3 gathered params",
                nbytes=gathered * w,
                formula=f"(max(layer, embedding) + prefetch bucket) {_m(gathered)} × {w} B",
                phase="update",
            )
        )
    else:
        rows.append(MemoryRow(name="weights", nbytes=base, formula=base_formula))
    if config.lora:
        m = master_bytes(config)
        rows.append(MemoryRow(name="lora adapters", nbytes=t * m, formula=f"T {_m(t)} × {m} B"))
    return rows


def _update_rows(config: Config, w: int, t: int) -> list[MemoryRow]:
    """Gradients and AdamW state (Rajbhandari et al. 2020, "ZeRO", §3: K = 12 under mixed precision)."""
    n, stage = _zero(config)
    g = master_bytes(config)
    if config.distributed.backend == "deepspeed" and config.distributed.bf16 and config.lora is None:
        opt, opt_formula = t * 12, f"T {_m(t)} × (4 + 4 + 4) B: fp32 master, m, v"
    else:
        opt, opt_formula = t * 2 * g, f"T {_m(t)} × 2 × {g} B: m, v"
    return [
        # A torch AdamW frees its gradients after each step (zero_grad(set_to_none=True)); DeepSpeed keeps its
        # gradient partitions allocated.
        _sharded(
            "gradients",
            t * g,
            f"T {_m(t)} × {g} B",
            n,
            stage >= 2,
            phase="resident" if config.distributed.backend == "deepspeed" else "update",
        ),
        _sharded("optimizer states", opt, opt_formula, n, stage >= 1),
    ]


def _copy_rows(config: Config, shape: ModelShape, w: int, t: int) -> list[MemoryRow]:
    """What DeepSpeed's samplers read beyond the engine's partitions, the samplers' snapshot under overlap, and
    a full fine-tune's frozen reference.

    ``distributed.sampling=replica``: a full copy per rank, resident. ``engine``: ZeRO 0-2 sample from the
    engine's full weights (no row); ZeRO-3 with the HF sampler gathers them to full size for collection and
    evaluation and releases them before the update (`mcprl_train.parallel.gathered`), a ``sampling`` transient.
    ZeRO-3 with vLLM pushes the weights one bucket at a time (``sampler.vllm_push_bucket_mb``, or the largest
    tensor alone), but a checkpoint still gathers them whole for its ``policy/`` (kept until the next update),
    so the transient and its row stay, at the same size.
    The reference is a frozen copy, full on every rank except under ZeRO-3, which partitions it like the engine
    (`mcprl_train.parallel.ds_reference`; its forward gathers a layer at a time, as the engine's does).
    ``collection.overlap`` (one process) copies the trainable weights for the samplers
    (`mcprl_train.loop.snapshot`) and shares the frozen ones.
    """
    rows: list[MemoryRow] = []
    lora = config.lora is not None
    ds = config.distributed
    if config.collection.overlap:
        m = master_bytes(config)
        formula = f"T {_m(t)} × {m} B, the samplers' copy of the trained weights (collection.overlap)"
        rows.append(MemoryRow(name="sampling snapshot", nbytes=t * m, formula=formula))
    if ds.backend == "deepspeed":
        base, base_formula = _base_weights(config, shape, w)
        match ds.sampling:
            case "replica":
                rows.append(
                    MemoryRow(
                        name="sampling replica",
                        nbytes=base + (t * 4 if lora else 0),
                        formula=base_formula + (" + adapters" if lora else "") + ", unpartitioned, per rank",
                    )
                )
            case "engine" if ds.zero_stage == 3:
                why = ", gathered for sampling, released before the update"
                if config.sampler.backend == "vllm":
                    bucket = config.sampler.vllm_push_bucket_mb
                    why = (
                        f", gathered for a checkpoint's policy/ (each push into vLLM: ≤ max({bucket:g} MiB,"
                        f" V·h {_m(shape.embedding_params)} × {w} B))"
                    )
                rows.append(
                    MemoryRow(
                        name="zero3 gathered weights",
                        nbytes=base,
                        formula=base_formula + why,
                        phase="sampling",
                    )
                )
            case "engine":
                pass
            case _ as unreachable:
                assert_never(unreachable)
    if not lora and config.grpo.kl_coef > 0:
        p = shape.num_params
        n, stage = _zero(config)
        rows.append(_sharded("reference policy", p * w, f"P {_m(p)} × {w} B, frozen copy", n, stage == 3))
    return rows


def _autocast_rows(config: Config, shape: ModelShape, w: int, t: int) -> list[MemoryRow]:
    """``bf16-mixed``: autocast's ``w``-byte copies of the trained weights its matrix products read.

    torch caches the cast of each weight for the autocast region and autograd keeps it for backward (measured
    in test_plan.py): a full fine-tune's linear layers and output head (``L·P_lin + V·h``; the embedding is
    looked up, not cast), or LoRA's adapters (``T``). A frozen bf16 or 4-bit base is used as it is.
    """
    if not is_mixed(config):
        return []
    if config.lora is not None:
        n, formula = t, f"T {_m(t)}"
    else:
        n = shape.decoder_linear_params + shape.embedding_params
        formula = f"(Σ P_lin + V·h) {_m(n)}"
    return [
        MemoryRow(name="autocast weight copies", nbytes=n * w, formula=f"{formula} × {w} B", phase="update")
    ]


def _base_weights(config: Config, shape: ModelShape, w: int) -> tuple[int, str]:
    p = shape.num_params
    if config.quantization is None:
        return p * w, f"P {_m(p)} × {w} B"
    linear = shape.decoder_linear_params
    nbytes = round(linear * NF4_BYTES_PER_PARAM) + (p - linear) * w
    return nbytes, f"linear {_m(linear)} × {NF4_BYTES_PER_PARAM:.4f} B ({config.quantization}) + rest × {w} B"


def _prefetch_bucket(config: Config) -> int:
    from mcprl_train.parallel.deepspeed import deepspeed_config

    return int(deepspeed_config(config)["zero_optimization"]["stage3_prefetch_bucket_size"])


def _sharded(
    name: str, nbytes: int, formula: str, n: int, partitioned: bool, *, phase: Phase = "resident"
) -> MemoryRow:
    if not partitioned:
        return MemoryRow(name=name, nbytes=nbytes, formula=formula, phase=phase)
    return MemoryRow(name=name, nbytes=nbytes // n, formula=f"{formula} / {n} ranks", phase=phase)


def _activation_rows(config: Config, shape: ModelShape, w: int, device: str) -> list[MemoryRow]:
    tokens = config.optim.micro_batch_tokens
    per_type = {
        t: layer_activation_bytes(config, shape, w, device=device, layer_type=t)
        for t in set(shape.layer_types)
    }
    layers = sum(per_type[t] for t in shape.layer_types)
    layer = max(per_type.values())
    s = stream_bytes(config, w)
    outside = model_activation_bytes(shape, w, s)
    big_l = shape.num_layers
    if config.model.gradient_checkpointing:
        act = tokens * (big_l * shape.hidden_size * s + layer + outside)
        formula = (
            f"{tokens} tok × ({big_l} × h {shape.hidden_size} × {s} B + one layer {layer} B + {outside} B)"
        )
    elif len(per_type) == 1:
        act = tokens * (big_l * layer + outside)
        formula = f"{tokens} tok × ({big_l} layers × {layer} B + {outside} B)"
    else:
        act = tokens * (layers + outside)
        counts = " + ".join(f"{shape.layer_types.count(t)} × {b} B" for t, b in sorted(per_type.items()))
        formula = f"{tokens} tok × ({counts} + {outside} B)"
    chunk = config.optim.logits_chunk_size
    return [
        MemoryRow(name="activations", nbytes=act, formula=formula, phase="update"),
        MemoryRow(
            name="logits chunk",
            nbytes=chunk * shape.vocab_size * 4 * 3,
            formula=f"{chunk} tok × V {shape.vocab_size} × 4 B × 3 (logits, log-softmax, gradient)",
            phase="update",
        ),
    ]


def _sampler_rows(config: Config, shape: ModelShape, w: int, device_memory: int | None) -> list[MemoryRow]:
    sampler = config.sampler
    match sampler.backend:
        case "hf":
            b, s = sampler.max_batch_size, config.env.max_total_tokens
            slots = shape.kv_tokens(s)
            attention = sum(t != "linear_attention" for t in shape.layer_types)
            # Keys leave the rotary embedding in the residual stream's dtype (fp32 under bf16-mixed), and the
            # decode pool keeps values in the keys' dtype.
            kv = stream_bytes(config, w)
            rows = [
                MemoryRow(
                    name="sampler kv cache",
                    nbytes=b * slots * 2 * shape.kv_dim * kv,
                    formula=f"{b} seqs × {slots:,} slots ({attention} attention layers × ≤ {s} tok) × 2 (k, v)"
                    f" × kv {shape.kv_dim} × {kv} B",
                    phase="sampling",
                )
            ]
            if shape.gated_delta_net is not None:
                linear = shape.layer_types.count("linear_attention")
                rows.append(
                    MemoryRow(
                        name="sampler linear-attention state",
                        nbytes=b * shape.state_bytes(w),
                        formula=f"{b} seqs × {linear} linear layers × {shape.gated_delta_net.state_bytes(w):,} B"
                        " (conv + fp32 recurrent state)",
                        phase="sampling",
                    )
                )
            if sampler.prefix_cache_mb > 0:
                mib = sampler.prefix_cache_mb
                rows.append(
                    MemoryRow(
                        name="sampler prefix cache", nbytes=int(mib * 2**20), formula=f"{mib:g} MiB budget"
                    )
                )
            return rows
        case "vllm":
            u = sampler.gpu_memory_utilization
            if device_memory is None:
                return []
            n, _ = _zero(config)
            # Under DeepSpeed every rank builds its own engine on its own device (`mcprl_policy.vllm_engine`).
            where = f" on each of the {n} ranks' devices" if n > 1 else ""
            return [
                MemoryRow(
                    name="vLLM share (reserved)",
                    nbytes=int(device_memory * u),
                    formula=f"{u:g} × device {device_memory / GIB:,.1f} GiB{where}"
                    + (" (asleep during the update: sampler.vllm_sleep)" if sampler.vllm_sleep else ""),
                    phase="sampling" if sampler.vllm_sleep else "resident",
                )
            ]
        case _ as unreachable:
            assert_never(unreachable)
