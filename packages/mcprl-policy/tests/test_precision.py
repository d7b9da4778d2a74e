"""Mixed precision on the embedded tiny model (CPU autocast runs bfloat16): dtypes, agreement with fp32, refusals."""

from __future__ import annotations

import json
from pathlib import Path

import anyio
import pytest
import torch
from safetensors.torch import load_file

from mcprl_policy import (
    HFSampler,
    LoraSettings,
    Policy,
    PolicyError,
    Precision,
    ReferencePolicy,
    SamplingParams,
)
from mcprl_policy.precision import check_device

SEQUENCES = [
    [int(t) for t in torch.randint(10, 500, (40,), generator=torch.Generator().manual_seed(s))]
    for s in range(4)
]


def tiny(dtype: str = "bfloat16", *, master_weights: bool = True, lora: LoraSettings | None = None) -> Policy:
    torch.manual_seed(0)
    return Policy.from_pretrained(
        "tiny",
        value_head=True,
        dtype=dtype,  # pyright: ignore[reportArgumentType]
        master_weights=master_weights,
        lora=lora,
    )


def test_precision_names_follow_lightning() -> None:
    assert Precision(dtype="float32").name == "fp32"
    assert Precision(dtype="bfloat16").name == "bf16-mixed"
    assert Precision(dtype="bfloat16", master_weights=False).name == "bf16-true"
    assert Precision(dtype="bfloat16").param_dtype == "float32"
    assert Precision(dtype="bfloat16", master_weights=False).param_dtype == "bfloat16"


def test_float16_is_refused_naming_the_missing_loss_scaling() -> None:
    with pytest.raises(ValueError, match="loss scaling"):
        Precision(dtype="float16")


def test_bf16_mixed_full_fine_tune_trains_fp32_weights_against_a_bf16_reference() -> None:
    policy = tiny()
    assert {p.dtype for p in policy.trainable_parameters()} == {torch.float32}
    reference = ReferencePolicy.for_policy(policy)
    assert reference.frozen is not None
    assert {p.dtype for p in reference.frozen.parameters()} == {torch.bfloat16}
    optimizer = torch.optim.AdamW(policy.trainable_parameters(), lr=5e-6)
    policy.forward_packed(SEQUENCES).logprobs.sum().backward()
    optimizer.step()
    states = [t for s in optimizer.state.values() for t in s.values() if t.dim() > 0]
    assert states
    assert {t.dtype for t in states} == {torch.float32}


def test_bf16_mixed_lora_trains_fp32_adapters_on_a_bf16_base() -> None:
    policy = tiny(lora=LoraSettings(r=4, alpha=8))
    frozen = [p for p in policy.model.parameters() if not p.requires_grad]
    assert frozen
    assert {p.dtype for p in frozen} == {torch.bfloat16}
    assert {p.dtype for p in policy.trainable_parameters()} == {torch.float32}


def test_bf16_true_keeps_every_weight_in_bf16_except_the_value_head() -> None:
    policy = tiny(master_weights=False, lora=LoraSettings(r=4, alpha=8))
    assert {p.dtype for p in policy.model.parameters()} == {torch.bfloat16}
    assert policy.value_head is not None
    assert {p.dtype for p in policy.value_head.parameters()} == {torch.float32}
    assert policy.precision.name == "bf16-true"


def test_bf16_mixed_forwards_are_within_a_stated_tolerance_of_fp32() -> None:
    """Tolerance: bf16 has an 8-bit mantissa (relative error 2^-9 per product); on the tiny model the mean
    per-token logprob error measured 1e-3 and the largest 4e-3 (for a logprob of about ln(1/2000) ≈ -7.6)."""
    fp32, mixed = tiny("float32"), tiny()
    with torch.no_grad():
        a, b = fp32.forward_packed(SEQUENCES), mixed.forward_packed(SEQUENCES)
        ref = ReferencePolicy.for_policy(mixed).logprobs(SEQUENCES)
    for got in (b.logprobs, ref.logprobs):
        diff = (got - a.logprobs).abs()
        assert float(diff.mean()) < 5e-3
        assert float(diff.max()) < 3e-2
    assert a.values is not None
    assert b.values is not None
    assert float((a.values - b.values).abs().max()) < 3e-2
    # The difference is autocast's, not noise: the bf16 forward is not the fp32 one.
    assert not torch.equal(a.logprobs, b.logprobs)


def test_the_hf_sampler_samples_under_the_policys_autocast() -> None:
    """Sampler logprobs match the learner's bf16-mixed recompute more closely than the fp32 forward's."""
    policy = tiny()
    sampler = HFSampler(policy, SamplingParams(temperature=1.0, seed=0), max_batch_size=4)

    async def sample() -> list[tuple[list[int], list[float]]]:
        out: list[tuple[list[int], list[float]]] = []
        for s in SEQUENCES:
            c = await sampler.sample(s[:12], max_new_tokens=16, seed=len(out))
            out.append((s[:12] + c.token_ids, c.logprobs))
        return out

    drawn = anyio.run(sample)
    with torch.no_grad():
        learner = policy.forward_packed([ids for ids, _ in drawn], values=False).split("logprobs")
        # The same float32 weights without autocast: what a sampler outside the autocast would report.
        plain = (
            Policy(
                model=policy.model, tokenizer=policy.tokenizer, value_head=None, base_model=policy.base_model
            )
            .forward_packed([ids for ids, _ in drawn], values=False)
            .split("logprobs")
        )
    mixed_err = max(
        float((row[12:] - torch.tensor(lp)).abs().max()) for row, (_, lp) in zip(learner, drawn, strict=True)
    )
    fp32_err = max(
        float((row[12:] - torch.tensor(lp)).abs().max()) for row, (_, lp) in zip(plain, drawn, strict=True)
    )
    assert mixed_err < 1e-2
    assert mixed_err < fp32_err


def test_a_saved_bf16_mixed_policy_holds_fp32_weights_and_loads_them_back(tmp_path: Path) -> None:
    policy = tiny()
    with torch.no_grad():
        for p in policy.trainable_parameters():
            p.add_(1e-6)  # below bf16's resolution: lost if anything on the way rounds to bf16
    policy.save_pretrained(tmp_path / "p")
    saved = load_file(tmp_path / "p" / "model.safetensors")
    assert {t.dtype for t in saved.values()} == {torch.float32}
    assert json.loads((tmp_path / "p" / "mcprl_policy.json").read_text())["lora"] is None
    loaded = Policy.from_pretrained(tmp_path / "p", dtype="bfloat16")
    for a, b in zip(policy.model.parameters(), loaded.model.parameters(), strict=True):
        assert torch.equal(a, b)


def test_bf16_on_a_gpu_without_bf16_arithmetic_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """No GPU here: torch.cuda's answers are replaced by a pre-Ampere GPU's (a T4's)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: False)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Tesla T4")
    with pytest.raises(PolicyError, match="Tesla T4 has no bf16 arithmetic"):
        check_device(Precision(dtype="bfloat16"), "cuda")
    check_device(Precision(dtype="float32"), "cuda")
