from __future__ import annotations

import builtins
from pathlib import Path
from typing import Any

import huggingface_hub.constants
import pytest
import torch

from mcprl_policy import LoraSettings, MissingExtraError, ModelLoadError, Policy, PolicyError

SEQUENCES = [[1, 5, 9, 33, 7, 2], [4, 4, 100, 250], [12, 13]]


def test_full_policy_round_trips_through_save_and_load(tiny_dir: Path, tmp_path: Path) -> None:
    policy = Policy.from_pretrained(str(tiny_dir))
    with torch.no_grad():
        policy.value_head.linear.bias.fill_(0.25)  # pyright: ignore[reportOptionalMemberAccess]
        before = policy.forward_packed(SEQUENCES)
    saved = policy.save_pretrained(tmp_path / "ckpt")
    assert (saved / "value_head.safetensors").is_file()
    loaded = Policy.from_pretrained(saved)
    with torch.no_grad():
        after = loaded.forward_packed(SEQUENCES)
    torch.testing.assert_close(after.logprobs, before.logprobs)
    torch.testing.assert_close(after.values, before.values)
    assert loaded.tokenizer.encode("ACME 12") == policy.tokenizer.encode("ACME 12")


def test_lora_policy_saves_only_the_adapter_and_reloads_it(tiny_dir: Path, tmp_path: Path) -> None:
    policy = Policy.from_pretrained(str(tiny_dir), lora=LoraSettings(r=4, alpha=8))
    with torch.no_grad():
        for name, p in policy.model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.05)
        before = policy.forward_packed(SEQUENCES)
    saved = policy.save_pretrained(tmp_path / "adapter")
    assert (saved / "adapter_model.safetensors").is_file()
    assert not (saved / "model.safetensors").exists()
    loaded = Policy.from_pretrained(saved)
    assert loaded.lora == LoraSettings(r=4, alpha=8)
    with torch.no_grad():
        after = loaded.forward_packed(SEQUENCES)
    torch.testing.assert_close(after.logprobs, before.logprobs)
    torch.testing.assert_close(after.values, before.values)
    assert {n for n, _ in loaded.named_trainable_parameters()} == {
        n for n, _ in policy.named_trainable_parameters()
    }


def test_value_head_receives_gradients_through_the_backbone(tiny_dir: Path) -> None:
    policy = Policy.from_pretrained(str(tiny_dir))
    out = policy.forward_packed(SEQUENCES)
    assert out.values is not None
    out.values[out.valid].square().mean().backward()
    head = policy.value_head
    assert head is not None
    assert head.linear.weight.grad is not None
    assert head.linear.weight.grad.abs().sum() > 0
    backbone_grads = [p.grad for n, p in policy.model.named_parameters() if "layers.1.mlp" in n]
    assert all(g is not None and g.abs().sum() > 0 for g in backbone_grads)


def test_lora_trains_only_adapters_and_value_head(tiny_dir: Path) -> None:
    policy = Policy.from_pretrained(str(tiny_dir), lora=LoraSettings(r=4))
    names = [n for n, _ in policy.named_trainable_parameters()]
    assert names, "nothing trainable"
    assert all("lora_" in n or n.startswith("value_head.") for n in names)
    targeted = {n.split(".lora_")[0].rsplit(".", 1)[-1] for n in names if "lora_" in n}
    assert targeted == {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}
    out = policy.forward_packed(SEQUENCES)
    (out.logprobs.sum() + out.values.sum()).backward()  # pyright: ignore[reportOptionalMemberAccess]
    frozen_with_grad = [
        n for n, p in policy.model.named_parameters() if not p.requires_grad and p.grad is not None
    ]
    assert frozen_with_grad == []
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in policy.trainable_parameters())


def test_gradient_checkpointing_gives_the_same_gradients(tiny_dir: Path) -> None:
    grads = []
    for enabled in (False, True):
        policy = Policy.from_pretrained(str(tiny_dir), gradient_checkpointing=enabled).train()
        policy.forward_packed(SEQUENCES).logprobs.sum().backward()
        grads.append(policy.model.get_input_embeddings().weight.grad.clone())  # pyright: ignore[reportCallIssue, reportAttributeAccessIssue, reportOptionalMemberAccess]
    torch.testing.assert_close(grads[0], grads[1])


def test_qlora_nf4_forward_and_backward_run_on_cpu(tiny_dir: Path) -> None:
    pytest.importorskip("bitsandbytes", reason="bitsandbytes (extra qlora) is not installed")
    policy = Policy.from_pretrained(str(tiny_dir), lora=LoraSettings(r=4), quantization="nf4")
    assert any("Linear4bit" in type(m).__name__ for m in policy.model.modules())
    out = policy.forward_packed(SEQUENCES)
    assert torch.isfinite(out.logprobs).all()
    (out.logprobs.sum() + out.values.sum()).backward()  # pyright: ignore[reportOptionalMemberAccess]
    lora_grads = [p.grad for n, p in policy.named_trainable_parameters() if "lora_B" in n]
    assert lora_grads
    assert all(g is not None and torch.isfinite(g).all() for g in lora_grads)
    assert any(g.abs().sum() > 0 for g in lora_grads if g is not None)


def test_four_bit_without_lora_is_refused(tiny_dir: Path) -> None:
    with pytest.raises(PolicyError, match="lora=LoraSettings"):
        Policy.from_pretrained(str(tiny_dir), quantization="nf4")


def test_missing_bitsandbytes_raises_the_install_hint(
    tiny_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_import = builtins.__import__

    def no_bitsandbytes(name: str, *args: Any, **kwargs: Any) -> Any:
        if name == "bitsandbytes" or name.startswith("bitsandbytes."):
            raise ImportError("No module named 'bitsandbytes'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_bitsandbytes)
    with pytest.raises(MissingExtraError, match=r"uv sync --extra qlora"):
        Policy.from_pretrained(str(tiny_dir), lora=LoraSettings(), quantization="nf4")


def test_unreachable_model_names_it_and_suggests_tiny(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(
        ModelLoadError, match=r"(?s)mcprl-missing/no-such-model.*--model tiny.*HF_HUB_OFFLINE"
    ):
        Policy.from_pretrained("mcprl-missing/no-such-model")


def test_missing_local_directory_is_a_load_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(ModelLoadError, match="--model tiny"):
        Policy.from_pretrained(str(tmp_path / "nowhere"))


def test_logits_chunk_size_is_settable_and_refuses_less_than_one(tiny_dir: Path) -> None:
    policy = Policy.from_pretrained(str(tiny_dir), value_head=False)
    assert policy.logits_chunk_size == 1024
    policy.logits_chunk_size = 3
    assert policy.logits_chunk_size == 3
    with pytest.raises(ValueError, match="logits_chunk_size must be >= 1"):
        policy.logits_chunk_size = 0
