from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Literal

import pytest
import torch
from rich.console import Console
from train_testkit import plan_cli
from transformers import (
    AutoModelForCausalLM,
    LlamaConfig,
    PretrainedConfig,
    Qwen2Config,
    Qwen3Config,
    Qwen3MoeConfig,
)

from mcprl_policy.config import Precision
from mcprl_policy.loading import torch_dtype
from mcprl_train.commands.architectures import KNOWN_ARCHITECTURES
from mcprl_train.commands.memory import layer_activation_bytes
from mcprl_train.commands.plan import ModelShape, load_model_shape, plan_memory, render_plan
from mcprl_train.config import Config
from mcprl_train.errors import PlanError

GIB = 1024**3
PROFILES = ("a100x2", "cpu", "mps", "single-gpu-lora", "vllm-gpu")

# The architectures' published config.json numbers, re-typed here (not read from the shipped table):
# h, i, L, heads, kv heads, head dim, V, tied.
QWEN3 = {
    "Qwen/Qwen3-0.6B": (1024, 3072, 28, 16, 8, 128, 151_936, True),
    "Qwen/Qwen3-1.7B": (2048, 6144, 28, 16, 8, 128, 151_936, True),
    "Qwen/Qwen3-4B": (2560, 9728, 36, 32, 8, 128, 151_936, True),
}

# Model cards' parameter counts in billions as printed (total, non-embedding or None when the card gives none).
PUBLISHED_PARAMS = {
    "Qwen/Qwen3-0.6B": ("0.6", "0.44"),
    "Qwen/Qwen3-1.7B": ("1.7", "1.4"),
    "Qwen/Qwen3-4B": ("4.0", "3.6"),
    "Qwen/Qwen3-8B": ("8.2", "6.95"),
    "Qwen/Qwen2.5-0.5B-Instruct": ("0.49", "0.36"),
    "Qwen/Qwen2.5-1.5B-Instruct": ("1.54", "1.31"),
    "Qwen/Qwen2.5-3B-Instruct": ("3.09", "2.77"),
    "Qwen/Qwen2.5-7B-Instruct": ("7.61", "6.53"),
    "meta-llama/Llama-3.2-1B-Instruct": ("1.23", None),
    "meta-llama/Llama-3.2-3B-Instruct": ("3.21", None),
    "meta-llama/Llama-3.1-8B-Instruct": ("8.03", None),
}


UPDATE_ROWS = {"activations", "logits chunk", "zero3 gathered params", "autocast weight copies"}


def readme_peak(config: Config, rows: dict[str, float]) -> float:
    """The README's peak: resident + max(update, sampling); with collection.overlap, resident + update + sampling."""
    update = {*UPDATE_ROWS, *(() if config.distributed.backend == "deepspeed" else ("gradients",))}
    sampling = {"sampler kv cache"}
    resident = sum(v for k, v in rows.items() if k not in update | sampling)
    phases = sum(v for k, v in rows.items() if k in update), sum(v for k, v in rows.items() if k in sampling)
    return resident + (sum(phases) if config.collection.overlap else max(phases))


def readme_estimate(config: Config, arch: tuple[int, int, int, int, int, int, int, bool]) -> dict[str, float]:
    """The README's "Memory model" table, transcribed formula by formula for a Qwen3 architecture."""
    h, i, big_l, heads, kv_heads, d, v, tied = arch
    q, k = heads * d, kv_heads * d
    w = 4 if config.model.dtype == "float32" else 2
    ds = config.distributed
    mixed = w == 2 and config.model.master_weights and ds.backend == "none"
    m = 4 if mixed else w  # the trainables' bytes: fp32 master weights under bf16-mixed
    s = 4 if mixed and config.lora is None else w  # the residual stream: fp32 in a bf16-mixed full fine-tune
    n = ds.num_gpus if ds.backend == "deepspeed" else 1
    z = ds.zero_stage if ds.backend == "deepspeed" else 0
    p_lin = h * q + 2 * h * k + q * h + 3 * h * i
    p_layer = p_lin + 2 * h + 2 * d
    p = v * h * (1 if tied else 2) + big_l * p_layer + h
    lora = config.lora
    ins = {"q": h, "k": h, "v": h, "o": q, "gate": h, "up": h, "down": i}
    outs = {"q": q, "k": k, "v": k, "o": h, "gate": i, "up": i, "down": h}
    t = big_l * lora.r * sum(ins[m] + outs[m] for m in ins) if lora is not None else p
    rows: dict[str, float] = {}
    if config.quantization is not None:
        weights = big_l * p_lin * (0.5 + 1 / 64 + 4 / (64 * 256)) + (p - big_l * p_lin) * w
    else:
        weights = p * (w if lora is not None else m)
    rows["weights"] = weights / n if z == 3 else weights
    if z == 3:
        rows["zero3 gathered params"] = (max(p_layer, v * h) + 5e7) * w
    if lora is not None:
        rows["lora adapters"] = m * t
    rows["gradients"] = m * t / (n if z >= 2 else 1)
    opt = 12 * t if ds.backend == "deepspeed" and ds.bf16 else 2 * m * t
    if mixed:
        rows["autocast weight copies"] = (t if lora is not None else big_l * p_lin + v * h) * w
    rows["optimizer states"] = opt / (n if z >= 1 else 1)
    if ds.backend == "deepspeed" and ds.sampling == "replica":
        rows["sampling replica"] = weights + (4 * t if lora else 0)
    if ds.backend == "deepspeed" and ds.sampling == "engine" and z == 3:
        rows["zero3 gathered weights"] = weights
    if config.collection.overlap:
        rows["sampling snapshot"] = m * t
    if lora is None and config.grpo.kl_coef > 0:
        rows["reference policy"] = p * w / (n if z == 3 else 1)
    a = 2 * (4 * h + 4) + w * (2 * q + 2 * k) + 4 * heads + 3 * w * i + 4 * (q + k) + 4 * (heads + kv_heads)
    if lora is None:
        a += 2 * s * h + (2 if s == w else 5) * w * h + w * i + w * (q + k)
    else:
        mask = 0 if lora.dropout == 0 else 1 if config.model.device == "cuda" else m
        # Without dropout or autocast's cast, q/k/v and gate/up read one input each, o_proj the attention output.
        inputs = 2 * h + i if lora.dropout == 0 and not mixed else sum(ins.values())
        a += inputs * (w + mask) + 7 * w * lora.r
    a0 = 8 + 2 * d * s + 4 * h + 4 + s * h + w * h
    tokens = config.optim.micro_batch_tokens
    if config.model.gradient_checkpointing:
        rows["activations"] = tokens * (big_l * h * s + a + a0)
    else:
        rows["activations"] = tokens * (big_l * a + a0)
    rows["logits chunk"] = config.optim.logits_chunk_size * v * 4 * 3
    if config.sampler.backend == "hf":
        rows["sampler kv cache"] = (
            config.sampler.max_batch_size * 2 * k * w * big_l * config.env.max_total_tokens
        )
        rows["sampler prefix cache"] = config.sampler.prefix_cache_mb * 2**20
    else:
        rows["vLLM share (reserved)"] = config.sampler.gpu_memory_utilization * 24 * GIB
    if config.model.device == "cuda":
        rows["cuda context"] = 0.5 * GIB
    return rows


@pytest.mark.parametrize("model", sorted(QWEN3))
@pytest.mark.parametrize("profile", PROFILES)
def test_plan_answers_offline_within_10_percent_of_the_readme_formulas(profile: str, model: str) -> None:
    config = Config.load(profile=profile, overrides=[f"model.name={model}"])
    plan = plan_memory(config, load_model_shape(model), device_memory=24 * GIB)
    expected = readme_estimate(config, QWEN3[model])
    got = plan.bytes_of()
    assert set(got) == set(expected)
    for name, nbytes in expected.items():
        assert got[name] == pytest.approx(nbytes, rel=0.10), name
    assert plan.total == pytest.approx(readme_peak(config, expected), rel=0.10)


@pytest.mark.parametrize(
    "name", sorted(n for n, s in KNOWN_ARCHITECTURES.items() if s.gated_delta_net is None)
)
def test_every_table_row_has_the_parameter_count_of_the_real_model(name: str) -> None:
    """Each row, as a transformers config, instantiated on the meta device (no memory, no weights); the
    Qwen3.5 hybrids' rows in test_plan_hybrid.py."""
    shape = KNOWN_ARCHITECTURES[name]
    family = {
        "Qwen/Qwen3-": Qwen3Config,
        "Qwen/Qwen2.5-": Qwen2Config,
        "meta-llama/": LlamaConfig,
        "HuggingFaceTB/SmolLM2-": LlamaConfig,
    }
    assert shape.max_position_embeddings is not None
    config_class = next(cls for prefix, cls in family.items() if name.startswith(prefix))
    cfg = config_class(
        vocab_size=shape.vocab_size,
        hidden_size=shape.hidden_size,
        intermediate_size=shape.intermediate_size,
        num_hidden_layers=shape.num_layers,
        num_attention_heads=shape.num_heads,
        num_key_value_heads=shape.num_kv_heads,
        tie_word_embeddings=shape.tie_embeddings,
        max_position_embeddings=shape.max_position_embeddings,
    )
    if config_class is not Qwen2Config:  # Qwen2 derives head_dim from hidden_size / heads
        cfg.head_dim = shape.head_dim
    assert ModelShape.from_hf_config(cfg).num_params == shape.num_params
    real = sum(p.numel() for p in _build(cfg, meta=True).parameters())
    assert shape.num_params == real


def _agrees_with_printed(value: float, printed: str) -> bool:
    """Within one unit of the printed number's last digit (cards both round and truncate)."""
    decimals = len(printed.partition(".")[2])
    return abs(value - float(printed)) < 10**-decimals


@pytest.mark.parametrize("name", sorted(PUBLISHED_PARAMS))
def test_every_table_row_reproduces_its_model_cards_parameter_count(name: str) -> None:
    shape = KNOWN_ARCHITECTURES[name]
    total, non_embedding = PUBLISHED_PARAMS[name]
    assert _agrees_with_printed(shape.num_params / 1e9, total)
    if non_embedding is not None:
        embeddings = shape.embedding_params * (1 if shape.tie_embeddings else 2)
        assert _agrees_with_printed((shape.num_params - embeddings) / 1e9, non_embedding)
    assert shape.source == f"https://huggingface.co/{name}/blob/main/config.json"


def _adamw_step(model: torch.nn.Module) -> torch.optim.AdamW:
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=1e-3)
    ids = torch.randint(0, 100, (1, 12))
    model(input_ids=ids, labels=ids).loss.backward()
    optimizer.step()  # pyright: ignore[reportUnknownMemberType]  # torch's step decorator erases its signature
    return optimizer


def _state_bytes(optimizer: torch.optim.AdamW) -> int:
    """Bytes of AdamW's per-parameter moments (the 0-d ``step`` counters excluded)."""
    return sum(
        t.numel() * t.element_size()
        for state in optimizer.state.values()
        for t in state.values()
        if isinstance(t, torch.Tensor) and t.dim() > 0
    )


def _build(cfg: PretrainedConfig, *, meta: bool = False) -> torch.nn.Module:
    """The real transformers model of ``cfg``: on the meta device (shapes only) or on CPU."""
    with torch.device("meta" if meta else "cpu"):
        # transformers leaves from_config's **kwargs (and so its return type) unannotated.
        return AutoModelForCausalLM.from_config(cfg)  # pyright: ignore[reportUnknownMemberType, reportUnknownVariableType]


def _save(cfg: PretrainedConfig, path: Path) -> str:
    cfg.save_pretrained(path)  # pyright: ignore[reportUnknownMemberType]  # transformers leaves **kwargs unannotated
    return str(path)


def _small_qwen3(*, tied: bool = False, sliding_window: int | None = None, layers: int = 2) -> Qwen3Config:
    return Qwen3Config(
        vocab_size=100,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        tie_word_embeddings=tied,
        use_sliding_window=sliding_window is not None,
        sliding_window=sliding_window,
        max_window_layers=1,  # layers from this index on use the sliding window
    )


def test_full_fine_tune_weights_grads_and_adamw_state_equal_the_measured_bytes(tmp_path: Path) -> None:
    cfg = _small_qwen3()
    shape = load_model_shape(_save(cfg, tmp_path / "m"))
    model = _build(cfg)
    optimizer = _adamw_step(model)
    params = list(model.parameters())
    rows = plan_memory(Config.load(profile="cpu"), shape).bytes_of()
    assert rows["weights"] == sum(p.numel() * p.element_size() for p in params)
    assert rows["gradients"] == sum(
        p.grad.numel() * p.grad.element_size() for p in params if p.grad is not None
    )
    assert rows["optimizer states"] == _state_bytes(optimizer)


def test_lora_on_a_bf16_base_equals_the_measured_bytes(tmp_path: Path) -> None:
    from mcprl_policy.config import LoraSettings
    from mcprl_policy.lora import apply_lora

    cfg = _small_qwen3(tied=True)
    shape = load_model_shape(_save(cfg, tmp_path / "m"))
    model = apply_lora(_build(cfg).to(torch.bfloat16), LoraSettings(r=4, alpha=8))
    optimizer = _adamw_step(model)
    config = Config.load(
        profile="cpu", overrides=["model.dtype=bfloat16", "lora.r=4", "lora.alpha=8", "grpo.kl_coef=0.1"]
    )
    rows = plan_memory(config, shape).bytes_of()
    frozen = [p for p in model.parameters() if not p.requires_grad]
    adapters = [p for p in model.parameters() if p.requires_grad]
    assert {p.dtype for p in adapters} == {torch.float32}
    assert rows["weights"] == sum(p.numel() * p.element_size() for p in frozen)
    assert rows["lora adapters"] == sum(p.numel() * p.element_size() for p in adapters)
    assert rows["gradients"] == sum(
        p.grad.numel() * p.grad.element_size() for p in adapters if p.grad is not None
    )
    assert rows["optimizer states"] == _state_bytes(optimizer)
    assert "reference policy" not in rows  # the adapters-off view is the reference


def _saved_bytes(model: torch.nn.Module, seq: int, *, mixed: bool) -> int:
    """Bytes autograd keeps for backward (parameters excluded, shared storages once) over ``seq`` tokens."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    saved: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in params:
            saved[storage.data_ptr()] = storage.nbytes()
        return t

    ids = torch.randint(0, 100, (1, seq))
    with (
        torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t),
        torch.autocast("cpu", dtype=torch.bfloat16, enabled=mixed),
    ):
        out = model(input_ids=ids).logits
    assert out.requires_grad
    return sum(saved.values())


def _model_as_trained(layers: int, precision: Precision, dropout: float | None) -> torch.nn.Module:
    """The tiny Qwen3 stored as `mcprl_policy.Policy.from_pretrained` stores it under ``precision``."""
    from mcprl_policy.config import LoraSettings
    from mcprl_policy.lora import apply_lora
    from mcprl_policy.precision import cast_trainable

    model = _build(_small_qwen3(layers=layers))
    if dropout is None:
        cast_trainable(model, precision)
        return model
    model = apply_lora(model.to(torch_dtype(precision.dtype)), LoraSettings(r=8, alpha=16, dropout=dropout))
    cast_trainable(model, precision)
    return model


@pytest.mark.parametrize(
    ("dtype", "master_weights", "lora_dropout"),
    [
        ("float32", True, None),
        ("float32", True, 0.0),
        ("float32", True, 0.05),
        ("bfloat16", False, None),
        ("bfloat16", False, 0.0),
        ("bfloat16", False, 0.05),
        ("bfloat16", True, None),
        ("bfloat16", True, 0.0),
        ("bfloat16", True, 0.05),
    ],
)
def test_one_layers_saved_activations_and_autocast_copies_equal_the_formulas(
    tmp_path: Path, dtype: Literal["float32", "bfloat16"], master_weights: bool, lora_dropout: float | None
) -> None:
    """A real Qwen3 forward on CPU (SDPA, under autocast for bf16-mixed): what one more layer adds to autograd's
    saved tensors — per token (the activations), and once (autocast's bf16 copies of the trained weights)."""
    precision = Precision(dtype=dtype, master_weights=master_weights)
    overrides = [f"model.dtype={dtype}", f"model.master_weights={str(master_weights).lower()}"]
    if lora_dropout is not None:
        overrides += ["lora.r=8", "lora.alpha=16", f"lora.dropout={lora_dropout}"]
    config = Config.load(profile="cpu", overrides=overrides)
    per_token: list[float] = []
    once: list[float] = []
    for layers in (1, 2):
        model = _model_as_trained(layers, precision, lora_dropout)
        model.train()
        short, long, longer = (_saved_bytes(model, n, mixed=precision.mixed) for n in (64, 128, 192))
        assert longer - long == long - short  # linear in the sequence: no s² attention scores kept
        per_token.append((long - short) / 64)
        once.append(short - 64 * per_token[-1])
    shape = load_model_shape(_save(_small_qwen3(), tmp_path / "m"))
    w = 4 if dtype == "float32" else 2
    assert per_token[1] - per_token[0] == layer_activation_bytes(config, shape, w, device="cpu")
    copies = plan_memory(config, shape).bytes_of().get("autocast weight copies", 0)
    trained_per_layer = (
        shape.lora_params(8) // shape.num_layers if lora_dropout is not None else shape.layer_linear_params
    )
    assert once[1] - once[0] == (trained_per_layer * w if precision.mixed else 0)
    if precision.mixed:
        assert copies == shape.num_layers * trained_per_layer * w + (
            0 if lora_dropout is not None else shape.embedding_params * w
        )


_DEEPSPEED_STATE = """
import json, sys, torch
from transformers import AutoModelForCausalLM, AutoConfig
from mcprl_train.config import Config
from mcprl_train.parallel.deepspeed import deepspeed_config, init_distributed, require_deepspeed

deepspeed = require_deepspeed()
init_distributed()
config = Config.load(profile="a100x2", overrides=["distributed.num_gpus=1", f"distributed.zero_stage={sys.argv[2]}"])
model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(sys.argv[1])).to(torch.bfloat16)
engine, optimizer, _, _ = deepspeed.initialize(
    model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=1e-3), config=deepspeed_config(config)
)
ids = torch.randint(0, 100, (1, 12))
engine.backward(engine(input_ids=ids, labels=ids).loss)
engine.step()
masters = optimizer.fp32_partitioned_groups_flat if sys.argv[2] == "3" else optimizer.single_partition_of_fp32_groups
moments = [t for s in optimizer.optimizer.state.values() for t in s.values() if t.dim() > 0]
print(json.dumps({"optimizer": sum(t.numel() * t.element_size() for t in [*masters, *moments])}))
"""


@pytest.mark.slow
@pytest.mark.parametrize("stage", [2, 3])
def test_deepspeed_optimizer_state_equals_the_measured_bytes(tmp_path: Path, stage: int) -> None:
    """A real ZeRO engine on one CPU rank (gloo): fp32 master weights + AdamW moments = 12 B per parameter."""
    model_dir = _save(_small_qwen3(), tmp_path / "m")
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(29_500 + stage), "RANK": "0"}
    env |= {"LOCAL_RANK": "0", "WORLD_SIZE": "1"}
    proc = subprocess.run(
        [sys.executable, "-c", _DEEPSPEED_STATE, model_dir, str(stage)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    measured = json.loads(proc.stdout.strip().splitlines()[-1])["optimizer"]
    config = Config.load(
        profile="a100x2", overrides=["distributed.num_gpus=1", f"distributed.zero_stage={stage}"]
    )
    assert plan_memory(config, load_model_shape(model_dir)).bytes_of()["optimizer states"] == measured


def test_a100x2_counts_the_gathered_weights_while_sampling_and_a_partitioned_reference_per_rank() -> None:
    shape = load_model_shape("Qwen/Qwen3-0.6B")
    config = Config.load(profile="a100x2")
    assert config.distributed.sampling == "engine"
    plan = plan_memory(config, shape)
    rows = plan.bytes_of()
    p = 596_049_920
    assert shape.num_params == p
    assert rows["weights"] == p * 2 // 2
    assert "sampling replica" not in rows
    assert rows["zero3 gathered weights"] == p * 2
    assert {r.name: r.phase for r in plan.rows}["zero3 gathered weights"] == "sampling"
    assert rows["reference policy"] == p * 2 // 2  # ZeRO-3 partitions it like the engine
    zero2 = plan_memory(config.replace(["distributed.zero_stage=2"]), shape).bytes_of()
    assert zero2["reference policy"] == p * 2  # full parameters on every rank: the reference is a full copy
    assert rows["zero3 gathered params"] == (151_936 * 1024 + 50_000_000) * 2
    assert rows["optimizer states"] == p * 12 // 2
    no_kl = plan_memory(config.replace(["grpo.kl_coef=0", "reference.every=0"]), shape).bytes_of()
    assert "reference policy" not in no_kl
    assert no_kl["zero3 gathered weights"] == p * 2


def test_under_zero3_the_vllm_push_holds_a_bucket_but_a_checkpoint_still_gathers_the_whole_model() -> None:
    shape = load_model_shape("Qwen/Qwen3-0.6B")
    hf = plan_memory(Config.load(profile="a100x2"), shape)
    vllm = plan_memory(
        Config.load(profile="a100x2", overrides=["sampler.backend=vllm", "sampler.vllm_push_bucket_mb=64"]),
        shape,
    )
    row = {r.name: r for r in vllm.rows}["zero3 gathered weights"]
    assert row.nbytes == hf.bytes_of()["zero3 gathered weights"] == shape.num_params * 2
    assert row.phase == "sampling"
    assert "checkpoint's policy/" in row.formula
    assert "max(64 MiB" in row.formula


@pytest.mark.parametrize(
    ("overrides", "saved"),
    [
        ([], False),  # a100x2's 64-sequence KV cache dominates: the peak is the sampling phase either way
        (["sampler.max_batch_size=1", "model.gradient_checkpointing=false"], True),  # the update dominates
    ],
)
def test_a_sampling_replica_is_resident_where_gathered_weights_live_only_while_sampling(
    overrides: list[str], saved: bool
) -> None:
    shape = load_model_shape("Qwen/Qwen3-0.6B")
    engine = plan_memory(Config.load(profile="a100x2", overrides=overrides), shape)
    replica = plan_memory(
        Config.load(profile="a100x2", overrides=[*overrides, "distributed.sampling=replica"]), shape
    )
    full = shape.num_params * 2
    assert replica.bytes_of()["sampling replica"] == full
    assert "zero3 gathered weights" not in replica.bytes_of()
    assert replica.phase_bytes("resident") - engine.phase_bytes("resident") == full
    assert engine.phase_bytes("sampling") - replica.phase_bytes("sampling") == full
    assert engine.phase_bytes("update") == replica.phase_bytes("update")
    assert replica.total - engine.total == (full if saved else 0)
    for stage in (0, 1, 2):
        staged = Config.load(profile="a100x2", overrides=[f"distributed.zero_stage={stage}"])
        names = plan_memory(staged, shape).bytes_of().keys()
        assert "sampling replica" not in names
        assert "zero3 gathered weights" not in names


def test_gradient_checkpointing_and_zero_stages_shrink_the_estimate() -> None:
    shape = load_model_shape("Qwen/Qwen3-0.6B")
    base = Config.load(profile="a100x2")
    with_ckpt = plan_memory(base, shape).bytes_of()["activations"]
    without = plan_memory(base.replace(["model.gradient_checkpointing=false"]), shape).bytes_of()[
        "activations"
    ]
    assert with_ckpt < without / 10
    by_stage = {
        stage: plan_memory(base.replace([f"distributed.zero_stage={stage}"]), shape).bytes_of()
        for stage in (0, 1, 2, 3)
    }
    assert by_stage[1]["optimizer states"] == by_stage[0]["optimizer states"] // 2
    assert by_stage[2]["gradients"] == by_stage[1]["gradients"] // 2
    assert by_stage[3]["weights"] == by_stage[2]["weights"] // 2
    assert by_stage[3]["zero3 gathered weights"] == by_stage[2]["weights"]


def test_a_bf16_mixed_samplers_kv_cache_is_float32_as_a_real_forward_fills_it() -> None:
    """Under bf16-mixed the keys leave the rotary embedding in the fp32 residual stream's dtype, and the values
    too: the plan counts 4 bytes per element, not the compute dtype's 2."""
    from mcprl_policy import Policy

    policy = Policy.from_pretrained("tiny", dtype="bfloat16", value_head=False)
    batch, tokens = 2, 20
    with torch.no_grad(), policy.autocast():
        cache = policy.model(input_ids=torch.randint(5, 100, (batch, tokens)), use_cache=True).past_key_values
    measured = sum(t.numel() * t.element_size() for layer in cache.layers for t in (layer.keys, layer.values))
    config = Config.load(
        profile="cpu",
        overrides=[
            "model.dtype=bfloat16",
            f"sampler.max_batch_size={batch}",
            f"env.max_total_tokens={tokens}",
        ],
    )
    rows = plan_memory(config, load_model_shape("tiny")).bytes_of()
    assert rows["sampler kv cache"] == measured
    assert {t.dtype for layer in cache.layers for t in (layer.keys, layer.values)} == {torch.float32}


def test_sliding_window_layers_bound_the_kv_cache(tmp_path: Path) -> None:
    cfg = _small_qwen3(sliding_window=256)
    shape = load_model_shape(_save(cfg, tmp_path / "m"))
    assert shape.layer_types == ("full_attention", "sliding_attention")
    assert shape.kv_tokens(4096) == 4096 + 256
    rows = plan_memory(Config.load(profile="single-gpu-lora"), shape).bytes_of()
    assert rows["sampler kv cache"] == 16 * (4096 + 256) * 2 * 32 * 2


def test_the_peak_is_the_resident_rows_plus_the_larger_phase() -> None:
    shape = load_model_shape("Qwen/Qwen3-0.6B")
    config = Config.load(profile="cpu", overrides=["model.name=Qwen/Qwen3-0.6B", "collection.overlap=false"])
    plan = plan_memory(config, shape)
    rows = plan.bytes_of()
    update = (
        rows["gradients"] + rows["activations"] + rows["logits chunk"]
    )  # a torch AdamW frees its gradients
    sampling = rows["sampler kv cache"]
    resident = rows["weights"] + rows["optimizer states"] + rows["sampler prefix cache"]
    assert plan.total == resident + max(update, sampling)
    assert plan.total < sum(rows.values())
    ds = plan_memory(Config.load(profile="a100x2"), shape)
    assert {r.name for r in ds.rows if r.phase == "resident"} >= {"gradients", "reference policy"}
    assert {r.name for r in ds.rows if r.phase == "sampling"} >= {
        "zero3 gathered weights",
        "sampler kv cache",
    }


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_overlap_holds_the_samplers_snapshot_as_measured_and_both_phases_at_once(
    tmp_path: Path, lora: bool
) -> None:
    from mcprl_policy import Policy
    from mcprl_policy.config import LoraSettings
    from mcprl_train.loop.snapshot import SamplingSnapshot

    saved = Policy.from_pretrained("tiny", value_head=False).save_pretrained(tmp_path / "tiny")
    policy = Policy.from_pretrained(
        saved, value_head=False, lora=LoraSettings(r=4, alpha=8) if lora else None
    )
    shared = {id(p) for p in policy.model.parameters()}
    copies = [p for p in SamplingSnapshot(policy).policy.model.parameters() if id(p) not in shared]
    overrides = [f"model.name={saved}", *(["lora.r=4", "lora.alpha=8"] if lora else [])]
    shape = load_model_shape(str(saved))
    overlapped = plan_memory(
        Config.load(profile="cpu", overrides=[*overrides, "collection.overlap=true"]), shape
    )
    serial = plan_memory(
        Config.load(profile="cpu", overrides=[*overrides, "collection.overlap=false"]), shape
    )
    snapshot = overlapped.bytes_of()["sampling snapshot"]
    assert snapshot == sum(p.numel() * p.element_size() for p in copies) > 0
    assert "sampling snapshot" not in serial.bytes_of()
    update, sampling = overlapped.phase_bytes("update"), overlapped.phase_bytes("sampling")
    assert overlapped.total == overlapped.phase_bytes("resident") + update + sampling
    assert overlapped.total - serial.total == snapshot + min(update, sampling)
    console = Console(record=True, width=250)
    console.print(render_plan(overlapped))
    assert "(collection.overlap: at once)" in console.export_text()


def test_vllm_share_is_a_row_of_the_device_memory() -> None:
    plan = plan_memory(Config.load(profile="vllm-gpu"), load_model_shape("Qwen/Qwen3-0.6B"))
    rows = plan.bytes_of()
    assert rows["vLLM share (reserved)"] == int(24 * GIB * 0.35)
    assert "sampler kv cache" not in rows
    assert plan.total == sum(rows.values())  # no sampling-only row: everything but the update is resident


def test_a_sleeping_vllm_engine_frees_its_share_for_the_update() -> None:
    shape = load_model_shape("Qwen/Qwen3-0.6B")
    awake = plan_memory(Config.load(profile="vllm-gpu"), shape)
    asleep = plan_memory(Config.load(profile="vllm-gpu", overrides=["sampler.vllm_sleep=true"]), shape)
    share = int(24 * GIB * 0.35)
    assert [r.phase for r in asleep.rows if r.name == "vLLM share (reserved)"] == ["sampling"]
    assert asleep.phase_bytes("sampling") == share
    assert asleep.total == asleep.phase_bytes("resident") + max(asleep.phase_bytes("update"), share)
    assert awake.total - asleep.total == min(share, asleep.phase_bytes("update")) > 0


def test_a_plan_that_exceeds_the_device_says_it_does_not_fit() -> None:
    config = Config.load(profile="a100x2", overrides=["distributed.device_memory_gb=16"])
    plan = plan_memory(config, load_model_shape("Qwen/Qwen3-0.6B"))
    assert plan.fits is False
    console = Console(record=True, width=160)
    console.print(render_plan(plan))
    text = console.export_text()
    assert "does not fit" in text
    assert "P 596.0M × 2 B, gathered for sampling, released before the update" in text
    assert "https://huggingface.co/Qwen/Qwen3-0.6B/blob/main/config.json" in text


def test_a_local_directory_is_read_when_the_table_lacks_the_model(tmp_path: Path) -> None:
    cfg = Qwen2Config(
        vocab_size=1000,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
    )
    shape = load_model_shape(_save(cfg, tmp_path / "qwen2"))
    assert shape.attention_bias
    assert shape.source == str(tmp_path / "qwen2" / "config.json")
    assert shape.num_params == sum(p.numel() for p in _build(cfg, meta=True).parameters())


def _cache_config(hub: Path, repo: str, cfg: PretrainedConfig) -> None:
    """A Hugging Face cache layout holding only ``repo``'s config.json, as `hf download repo config.json`."""
    root = hub / f"models--{repo.replace('/', '--')}"
    _save(cfg, root / "snapshots" / ("0" * 40))
    (root / "refs").mkdir()
    (root / "refs" / "main").write_text("0" * 40)


def test_a_cached_config_is_read_and_the_table_wins_over_the_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    _cache_config(tmp_path / "hub", "someone/small-qwen3", _small_qwen3())
    _cache_config(tmp_path / "hub", "Qwen/Qwen3-0.6B", _small_qwen3())
    shape = load_model_shape("someone/small-qwen3")
    assert (shape.hidden_size, shape.num_layers) == (64, 2)
    assert "models--someone--small-qwen3" in shape.source
    assert load_model_shape("Qwen/Qwen3-0.6B") == KNOWN_ARCHITECTURES["Qwen/Qwen3-0.6B"]


def test_a_built_in_pretrained_model_is_the_published_model_it_converts() -> None:
    """``smollm2-135m`` plans without being fetched: SmolLM2-135M-Instruct's row, 134.5 M parameters."""
    shape = load_model_shape("smollm2-135m")
    assert shape == KNOWN_ARCHITECTURES["HuggingFaceTB/SmolLM2-135M-Instruct"]
    assert shape.num_params == 134_515_008


def test_the_plan_command_answers_for_a_profile_model_without_the_hub(tmp_path: Path) -> None:
    proc = plan_cli(tmp_path, "--profile", "a100x2")
    assert proc.returncode == 0, proc.stderr
    assert "Qwen/Qwen3-0.6B: 596.0 M params" in proc.stdout
    assert "zero3 gathered weights" in proc.stdout
    assert "sampling replica" not in proc.stdout
    assert "fits" in proc.stdout


def test_an_unknown_uncached_model_fails_saying_how_to_provide_it(tmp_path: Path) -> None:
    proc = plan_cli(tmp_path, "--profile", "a100x2", "--model", "someone/not-cached")
    assert proc.returncode == 2
    assert "hf download someone/not-cached config.json" in proc.stderr


def test_resolving_a_model_never_opens_a_connection(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import huggingface_hub.constants

    def no_network(*args: object, **kwargs: object) -> None:
        raise AssertionError(f"plan opened a connection: {args}")

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(socket.socket, "connect", no_network)
    monkeypatch.setattr(socket, "create_connection", no_network)
    assert load_model_shape("Qwen/Qwen3-4B").num_layers == 36
    with pytest.raises(PlanError, match="plan never downloads"):
        load_model_shape("someone/not-cached")


def test_mixture_of_experts_configs_are_refused_with_the_reason(tmp_path: Path) -> None:
    moe = Qwen3MoeConfig(num_hidden_layers=2, hidden_size=64, vocab_size=100, num_experts=4)
    with pytest.raises(PlanError, match="mixture-of-experts"):
        load_model_shape(_save(moe, tmp_path / "moe"))


def test_unreadable_model_configs_are_plan_errors(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(PlanError, match=r"has no config\.json"):
        load_model_shape(str(tmp_path / "empty"))
    (tmp_path / "file").write_text("{}")
    with pytest.raises(PlanError, match="not a directory"):
        load_model_shape(str(tmp_path / "file"))
    with pytest.raises(PlanError, match="not in plan's table"):
        load_model_shape(str(tmp_path / "missing"))


def test_tiny_model_shape_comes_from_the_embedded_preset() -> None:
    shape = load_model_shape("tiny")
    assert (shape.hidden_size, shape.num_layers) == (128, 2)
    assert plan_memory(Config.load(), shape).device == "cpu"


def test_unknown_lora_target_is_a_plan_error() -> None:
    with pytest.raises(PlanError, match="not linear layers"):
        KNOWN_ARCHITECTURES["Qwen/Qwen3-0.6B"].lora_params(4, ("c_attn",))
