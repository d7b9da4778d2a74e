"""LoRA targets by architecture: a Qwen3.5-style hybrid gets adapters on both of its layer kinds."""

from __future__ import annotations

import pytest
import torch
from peft.tuners.lora import LoraLayer
from torch import nn

from mcprl_policy import LoraSettings, PolicyError
from mcprl_policy.lora import apply_lora, lora_target_modules
from mcprl_policy.standin import standin_model


def _hybrid_with_lora() -> nn.Module:
    model = standin_model("qwen3.5", vocab_size=64, eos_token_id=1, pad_token_id=0, hidden_size=16)
    return apply_lora(model, LoraSettings(r=2, alpha=4.0))


def _decoder_linears(model: nn.Module) -> dict[str, nn.Module]:
    """Every linear layer inside the decoder layers (not the embedding or the output head)."""
    modules: dict[str, nn.Module] = {  # pyright: ignore[reportAssignmentType]
        name: module
        for name, module in model.named_modules()
        if ".layers." in name
        and (isinstance(module, LoraLayer) or type(module) is nn.Linear)
        and not name.endswith(("lora_A.default", "lora_B.default", "base_layer"))
    }
    return modules


def test_default_targets_of_a_hybrid_adapt_every_linear_layer_of_both_layer_kinds() -> None:
    model = _hybrid_with_lora()
    linears = _decoder_linears(model)
    unadapted = sorted(name for name, module in linears.items() if not isinstance(module, LoraLayer))
    assert unadapted == []
    adapted = {name.rsplit(".", 2)[-2] + "." + name.rsplit(".", 1)[-1] for name in linears}
    assert {
        "linear_attn.in_proj_qkv",
        "linear_attn.in_proj_z",
        "linear_attn.in_proj_b",
        "linear_attn.in_proj_a",
        "linear_attn.out_proj",
        "self_attn.q_proj",
        "self_attn.k_proj",
        "self_attn.v_proj",
        "self_attn.o_proj",
        "mlp.gate_proj",
        "mlp.up_proj",
        "mlp.down_proj",
    } == adapted


def test_one_step_changes_the_adapters_of_both_layer_kinds_and_nothing_else() -> None:
    model = _hybrid_with_lora()
    trainable = {name: p for name, p in model.named_parameters() if p.requires_grad}
    assert trainable
    assert all("lora_" in name for name in trainable)
    frozen = {name: p.detach().clone() for name, p in model.named_parameters() if not p.requires_grad}
    before = {name: p.detach().clone() for name, p in trainable.items()}
    optimizer = torch.optim.SGD(list(trainable.values()), lr=0.1)
    ids = torch.randint(2, 64, (2, 12), generator=torch.Generator().manual_seed(0))
    model(input_ids=ids, labels=ids).loss.backward()
    optimizer.step()
    changed = {name for name, p in trainable.items() if not torch.equal(p, before[name])}
    # lora_B starts at zero, so the first step moves every lora_B (and no lora_A: its gradient is B^T g = 0).
    assert changed == {name for name in trainable if "lora_B" in name}
    assert any(".linear_attn." in name for name in changed)
    assert any(".self_attn." in name for name in changed)
    assert all(torch.equal(p, frozen[name]) for name, p in model.named_parameters() if not p.requires_grad)


def test_explicit_targets_win_and_an_unknown_architecture_names_the_option() -> None:
    assert lora_target_modules("qwen3_5_text", LoraSettings(target_modules=("out_proj",))) == ("out_proj",)
    with pytest.raises(
        PolicyError, match=r"no default LoRA target modules for model type 'rwkv'.*target_modules"
    ):
        lora_target_modules("rwkv", LoraSettings())
