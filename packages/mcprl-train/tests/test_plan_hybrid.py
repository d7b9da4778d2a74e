"""`mcprl-train plan` on Qwen3.5 hybrids: Gated DeltaNet linear attention beside gated full attention.

The estimates are checked against the real transformers model (``Qwen3_5ForCausalLM``, the teammates'
stand-in of `mcprl_policy.standin`) on CPU: its parameters, gradients, AdamW state, LoRA adapters and the cache a
real forward fills.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import pytest
import torch
from train_testkit import plan_cli
from transformers import AutoModelForCausalLM, PreTrainedModel
from transformers.models.qwen3_5.configuration_qwen3_5 import Qwen3_5TextConfig

from mcprl_policy.standin import standin_model
from mcprl_train.commands.architectures import KNOWN_ARCHITECTURES
from mcprl_train.commands.memory import layer_activation_bytes
from mcprl_train.commands.plan import ModelShape, load_model_shape, plan_memory
from mcprl_train.config import Config
from mcprl_train.errors import PlanError

HYBRIDS = sorted(name for name, shape in KNOWN_ARCHITECTURES.items() if shape.gated_delta_net is not None)


def _standin() -> PreTrainedModel:
    """The four-layer ``[linear, full] * 2`` Qwen3.5 stand-in (hidden 64, 4 heads, 2 KV heads)."""
    return standin_model("qwen3.5", vocab_size=100, eos_token_id=1, pad_token_id=0)


def _as_module(model: PreTrainedModel) -> torch.nn.Module:
    """transformers wraps ``PreTrainedModel.to`` in a decorator that pyright cannot read; torch's is typed."""
    return model


def _meta_model(cfg: Qwen3_5TextConfig) -> torch.nn.Module:
    """The real model of ``cfg`` on the meta device: shapes only, no memory."""
    with torch.device("meta"):
        # transformers leaves from_config's **kwargs (and so its return type) unannotated.
        return AutoModelForCausalLM.from_config(cfg)  # pyright: ignore[reportUnknownMemberType, reportUnknownVariableType]


def _cpu_model(cfg: Qwen3_5TextConfig) -> torch.nn.Module:
    # transformers leaves from_config's **kwargs (and so its return type) unannotated.
    return AutoModelForCausalLM.from_config(cfg)  # pyright: ignore[reportUnknownMemberType, reportUnknownVariableType]


def _standin_shape(model: PreTrainedModel, tmp_path: Path) -> ModelShape:
    model.config.save_pretrained(tmp_path / "m")  # pyright: ignore[reportUnknownMemberType]  # transformers leaves **kwargs unannotated
    return load_model_shape(str(tmp_path / "m"))


def _nbytes(tensors: Iterable[torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def _adamw_step(model: torch.nn.Module) -> torch.optim.AdamW:
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    ids = torch.randint(0, 100, (1, 12))
    model(input_ids=ids, labels=ids, use_cache=False).loss.backward()
    optimizer.step()  # pyright: ignore[reportUnknownMemberType]  # torch's step decorator erases its signature
    return optimizer


def _state_bytes(optimizer: torch.optim.AdamW) -> int:
    return _nbytes(
        [
            t
            for state in optimizer.state.values()
            for t in state.values()
            if isinstance(t, torch.Tensor) and t.dim()
        ]
    )


@pytest.mark.parametrize("name", HYBRIDS)
def test_every_hybrid_table_row_has_the_parameter_count_of_the_real_model(name: str) -> None:
    """Each row as a ``Qwen3_5TextConfig``, built on the meta device, and read back by ``from_hf_config``."""
    shape = KNOWN_ARCHITECTURES[name]
    gdn = shape.gated_delta_net
    assert gdn is not None
    assert shape.max_position_embeddings is not None
    cfg = Qwen3_5TextConfig(
        vocab_size=shape.vocab_size,
        hidden_size=shape.hidden_size,
        intermediate_size=shape.intermediate_size,
        num_hidden_layers=shape.num_layers,
        num_attention_heads=shape.num_heads,
        num_key_value_heads=shape.num_kv_heads,
        head_dim=shape.head_dim,
        linear_num_key_heads=gdn.num_key_heads,
        linear_num_value_heads=gdn.num_value_heads,
        linear_key_head_dim=gdn.key_head_dim,
        linear_value_head_dim=gdn.value_head_dim,
        linear_conv_kernel_dim=gdn.conv_kernel,
        layer_types=(["linear_attention"] * 3 + ["full_attention"]) * (shape.num_layers // 4),
        tie_word_embeddings=shape.tie_embeddings,
        max_position_embeddings=shape.max_position_embeddings,
    )
    assert ModelShape.from_hf_config(cfg, source=shape.source) == shape
    assert shape.num_params == sum(p.numel() for p in _meta_model(cfg).parameters())
    assert shape.source == f"https://huggingface.co/{name}/blob/main/config.json"


def test_the_standins_weights_gradients_and_adamw_state_equal_the_measured_bytes(tmp_path: Path) -> None:
    model = _standin()
    shape = _standin_shape(model, tmp_path)
    assert shape.layer_types == ("linear_attention", "full_attention") * 2
    optimizer = _adamw_step(model)
    params = list(model.parameters())
    rows = plan_memory(Config.load(profile="cpu"), shape).bytes_of()
    assert rows["weights"] == _nbytes(params)
    assert rows["gradients"] == _nbytes([p.grad for p in params if p.grad is not None])
    assert rows["optimizer states"] == _state_bytes(optimizer)


def test_lora_on_the_standin_adapts_every_linear_layer_and_equals_the_measured_bytes(tmp_path: Path) -> None:
    from mcprl_policy.config import LoraSettings
    from mcprl_policy.lora import apply_lora

    base = _standin()
    shape = _standin_shape(base, tmp_path)
    _as_module(base).to(torch.bfloat16)
    model = apply_lora(base, LoraSettings(r=4, alpha=8))
    optimizer = _adamw_step(model)
    config = Config.load(profile="cpu", overrides=["model.dtype=bfloat16", "lora.r=4", "lora.alpha=8"])
    rows = plan_memory(config, shape).bytes_of()
    adapters = [p for p in model.parameters() if p.requires_grad]
    assert rows["weights"] == _nbytes([p for p in model.parameters() if not p.requires_grad])
    assert rows["lora adapters"] == _nbytes(adapters)
    assert rows["optimizer states"] == _state_bytes(optimizer)
    linear_only = shape.lora_params(4, ("in_proj_qkv", "out_proj"))
    assert 0 < linear_only < shape.lora_params(4)
    with pytest.raises(PlanError, match="in_proj_z"):
        shape.lora_params(4, ("c_attn",))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_sampler_rows_equal_the_cache_a_real_forward_fills(tmp_path: Path, dtype: torch.dtype) -> None:
    """KV only in the full-attention layers; a conv and an fp32 recurrent state per linear layer and sequence."""
    batch, tokens = 3, 20
    model = _standin()
    _as_module(model).to(dtype)
    shape = _standin_shape(model, tmp_path)
    with torch.no_grad():
        cache = model(input_ids=torch.randint(0, 100, (batch, tokens)), use_cache=True).past_key_values
    kv: list[torch.Tensor] = []
    states: list[torch.Tensor] = []
    for layer in cache.layers:
        if hasattr(layer, "keys"):
            kv += [layer.keys, layer.values]
        else:
            states += [*layer.conv_states.values(), *layer.recurrent_states.values()]
    name = "bfloat16" if dtype == torch.bfloat16 else "float32"
    config = Config.load(
        profile="cpu",
        overrides=[
            f"model.dtype={name}",
            "model.master_weights=false",  # the model above is cast whole: bf16-true
            f"sampler.max_batch_size={batch}",
            f"env.max_total_tokens={tokens}",
        ],
    )
    rows = plan_memory(config, shape).bytes_of()
    assert len(kv) == 4
    assert len(states) == 4
    assert rows["sampler kv cache"] == _nbytes(kv)
    assert rows["sampler linear-attention state"] == _nbytes(states)


def test_a_dense_model_has_no_linear_attention_state_row() -> None:
    rows = plan_memory(Config.load(profile="cpu"), load_model_shape("Qwen/Qwen3-0.6B")).bytes_of()
    assert "sampler linear-attention state" not in rows


def test_a_hybrids_kv_cache_is_a_quarter_of_a_dense_one_of_the_same_attention() -> None:
    shape = KNOWN_ARCHITECTURES["Qwen/Qwen3.5-4B"]
    assert shape.kv_tokens(1000) == 8 * 1000
    gdn = shape.gated_delta_net
    assert gdn is not None
    # 24 linear layers: conv (2·2048 + 4096 channels × 4 taps × 2 B) + 32 heads × 128 × 128 × 4 B fp32.
    assert shape.state_bytes(2) == 24 * (8192 * 4 * 2 + 32 * 128 * 128 * 4)


def test_plan_answers_offline_for_a_qwen3_5_size(tmp_path: Path) -> None:
    proc = plan_cli(
        tmp_path, "--profile", "single-gpu-lora", "--set", "model.name=Qwen/Qwen3.5-4B", columns=200
    )
    assert proc.returncode == 0, proc.stderr
    assert "Qwen/Qwen3.5-4B: 4,205.8 M params" in proc.stdout
    assert "sampler linear-attention state" in proc.stdout
    assert "8 attention layers" in proc.stdout
    assert "https://huggingface.co/Qwen/Qwen3.5-4B/blob/main/config.json" in proc.stdout


@pytest.mark.parametrize("name", HYBRIDS)
def test_the_readmes_hybrid_formulas_give_the_plans_parameters_and_sampler_rows(name: str) -> None:
    """The README's "Hybrids (Qwen3.5)" formulas, transcribed, against `plan` under single-gpu-lora."""
    shape = KNOWN_ARCHITECTURES[name]
    gdn = shape.gated_delta_net
    assert gdn is not None
    h, i, d, big_v = shape.hidden_size, shape.intermediate_size, shape.head_dim, shape.vocab_size
    q, k = shape.num_heads * d, shape.num_kv_heads * d
    kd, vd, hv = (
        gdn.num_key_heads * gdn.key_head_dim,
        gdn.num_value_heads * gdn.value_head_dim,
        gdn.num_value_heads,
    )
    c, kappa = 2 * kd + vd, gdn.conv_kernel
    l_lin = shape.layer_types.count("linear_attention")
    l_full = shape.num_layers - l_lin
    p_lin_full = h * 2 * q + 2 * h * k + q * h + 3 * h * i
    p_lin_linear = h * c + h * vd + 2 * h * hv + vd * h + 3 * h * i
    p_full = p_lin_full + 2 * h + 2 * d
    p_linear = p_lin_linear + 2 * h + c * kappa + 2 * hv + gdn.value_head_dim
    p = big_v * h * (1 if shape.tie_embeddings else 2) + l_full * p_full + l_lin * p_linear + h
    assert shape.num_params == p
    config = Config.load(profile="single-gpu-lora", overrides=[f"model.name={name}"])
    r, w = 16, 2
    ins_full = (h, h, h, q, h, h, i)
    outs_full = (2 * q, k, k, h, i, i, h)
    ins_linear = (h, h, h, h, vd, h, h, i)
    outs_linear = (c, vd, hv, hv, h, i, i, h)
    t = r * (l_full * (sum(ins_full) + sum(outs_full)) + l_lin * (sum(ins_linear) + sum(outs_linear)))
    plan = plan_memory(config, shape, device_memory=24 * 1024**3)
    assert plan.trainable_params == t
    rows = plan.bytes_of()
    b, t_max = config.sampler.max_batch_size, config.env.max_total_tokens
    assert rows["sampler kv cache"] == b * 2 * k * w * l_full * t_max
    assert rows["sampler linear-attention state"] == b * l_lin * (c * kappa * w + hv * 128 * 128 * 4)
    linear = l_full * p_lin_full + l_lin * p_lin_linear
    nf4 = 0.5 + 1 / 64 + 4 / (64 * 256)
    assert rows["weights"] == pytest.approx(linear * nf4 + (p - linear) * w, abs=1)


def _saved_bytes_per_token(model: torch.nn.Module) -> float:
    """Bytes autograd keeps for backward per token (parameters excluded, shared storages once), from the
    difference between 128 and 64 tokens (the linear-attention CPU fallback works in chunks of 64)."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}

    def saved(seq: int) -> int:
        kept: dict[int, int] = {}

        def pack(t: torch.Tensor) -> torch.Tensor:
            if t.untyped_storage().data_ptr() not in params:
                kept[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            model(input_ids=torch.randint(0, 100, (1, seq)), use_cache=False)
        return sum(kept.values())

    return (saved(128) - saved(64)) / 64


def _gated_full_attention(layers: int) -> Qwen3_5TextConfig:
    return Qwen3_5TextConfig(
        vocab_size=100,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        layer_types=["full_attention"] * layers,
    )


def test_a_gated_full_attention_layers_saved_activations_equal_the_formula_in_fp32(tmp_path: Path) -> None:
    """One more full-attention layer of a real Qwen3.5 (fp32 full fine-tune, SDPA on CPU)."""
    per_layer: list[float] = []
    for layers in (1, 2):
        model = _cpu_model(_gated_full_attention(layers))
        model.train()
        per_layer.append(_saved_bytes_per_token(model))
    cfg = _gated_full_attention(2)
    cfg.save_pretrained(tmp_path / "m")  # pyright: ignore[reportUnknownMemberType]  # transformers leaves **kwargs unannotated
    shape = load_model_shape(str(tmp_path / "m"))
    assert shape.attention_output_gate
    config = Config.load(profile="cpu")
    assert per_layer[1] - per_layer[0] == layer_activation_bytes(config, shape, 4, device="cpu")


def test_a_published_style_vision_language_config_is_read_through_its_text_config(tmp_path: Path) -> None:
    """The hub's Qwen3.5 checkpoints are ``Qwen3_5Config`` (vision + text): plan sizes the language model, as a
    user's cached config of a size the table lacks (Qwen3.5-2B) would be read."""
    from transformers.models.qwen3_5.configuration_qwen3_5 import Qwen3_5Config

    text = _gated_full_attention(2).to_dict()
    text["layer_types"] = ["linear_attention", "full_attention"]
    Qwen3_5Config(text_config=text).save_pretrained(tmp_path / "vl")  # pyright: ignore[reportUnknownMemberType]
    shape = load_model_shape(str(tmp_path / "vl"))
    assert shape.layer_types == ("linear_attention", "full_attention")
    assert shape.attention_output_gate
    assert shape.num_params == sum(p.numel() for p in _meta_model(Qwen3_5TextConfig(**text)).parameters())
