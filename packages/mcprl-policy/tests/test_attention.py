"""Varlen attention for packed rows: exact against padded and unpacked forwards, chosen at load time."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import anyio
import pytest
import torch
from torch import nn
from transformers import AttentionInterface, Qwen3_5ForCausalLM, Qwen3_5TextConfig
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from mcprl_policy import (
    HFSampler,
    Layout,
    LoraSettings,
    Policy,
    PolicyError,
    ReferencePolicy,
    SamplingParams,
    UnpackableModelError,
    packed_forward,
    padded_forward,
    policy_forward,
)
from mcprl_policy.attention import (
    PER_ROW_MIN_MASKED,
    PER_ROW_MIN_WINDOW,
    VARLEN_SDPA,
    check_packable,
    decode_sdpa,
    resolve_attn_implementation,
    row_windows,
    varlen_sdpa_attention,
)
from mcprl_policy.packed import pack_sequences


class _Heads(nn.Module):
    """What transformers' attention functions read from the attention module: the grouped-query factor."""

    def __init__(self, groups: int) -> None:
        super().__init__()
        self.num_key_value_groups = groups


def _block_causal_attention_transcribed(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lens: Sequence[int], scale: float
) -> torch.Tensor:
    """softmax(q·kᵀ·scale + M)·v with M = 0 where key j is in query i's sequence and j <= i, else -inf.

    Vaswani et al. 2017, eq. 1, with the causal mask restricted to each packed sequence; ``(1, H, N, D)`` in,
    ``(1, N, H, D)`` out, keys and values repeated per query-head group.
    """
    groups = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    seq_of = torch.repeat_interleave(torch.arange(len(lens)), torch.tensor(lens))
    n = q.shape[2]
    out = torch.empty_like(q)
    for h in range(q.shape[1]):
        for i in range(n):
            scores = []
            for j in range(n):
                allowed = j <= i and seq_of[j] == seq_of[i]
                scores.append(float(q[0, h, i] @ k[0, h, j]) * scale if allowed else -math.inf)
            weights = torch.softmax(torch.tensor(scores, dtype=q.dtype), dim=0)
            out[0, h, i] = weights @ v[0, h]
    return out.transpose(1, 2)


def _seqs(policy: Policy, lens: Sequence[int], seed: int = 0) -> list[list[int]]:
    config: Any = policy.model.config
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(10, int(config.vocab_size), (n,), generator=g).tolist() for n in lens]


def test_varlen_sdpa_equals_the_transcribed_block_causal_attention() -> None:
    lens = [3, 1, 6, 4]
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 4, sum(lens), 8, generator=g, dtype=torch.float64)
    k = torch.randn(1, 2, sum(lens), 8, generator=g, dtype=torch.float64)
    v = torch.randn(1, 2, sum(lens), 8, generator=g, dtype=torch.float64)
    cu = pack_sequences([[1] * n for n in lens]).cu_seqlens
    out, weights = varlen_sdpa_attention(
        _Heads(2),
        q,
        k,
        v,
        None,
        scaling=0.3,
        cu_seq_lens_q=cu,
        cu_seq_lens_k=cu,
        max_length_q=6,
        max_length_k=6,
    )
    assert weights is None
    torch.testing.assert_close(out, _block_causal_attention_transcribed(q, k, v, lens, 0.3))


def test_varlen_sdpa_without_boundaries_is_transformers_sdpa() -> None:
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(2, 4, 5, 8, generator=g) for _ in range(3))
    mask = torch.ones(2, 1, 5, 5, dtype=torch.bool).tril()
    mask[1, :, :, :2] = False
    heads = _Heads(1)
    ours, _ = varlen_sdpa_attention(heads, q, k, v, mask, scaling=0.25)
    theirs, _ = sdpa_attention_forward(heads, q, k, v, mask, scaling=0.25)
    assert torch.equal(ours, theirs)


@pytest.mark.parametrize("rows", [1, 5])
def test_a_decode_step_attends_grouped_heads_without_copies_and_gives_transformers_sdpa_bits(
    rows: int,
) -> None:
    """One query per row over a strided window of a cache, 3 query heads per KV head, left-padded rows: the
    grouped kernel (`decode_sdpa`) equals transformers' ``sdpa`` with its per-group copies, bit for bit."""
    g = torch.Generator().manual_seed(2)
    cache_k, cache_v = (torch.randn(8, 2, 40, 16, generator=g) for _ in range(2))
    k, v = cache_k[:rows, :, 5:30], cache_v[:rows, :, 5:30]  # the pool's window: not contiguous
    q = torch.randn(rows, 6, 1, 16, generator=g)
    mask = torch.ones(rows, 1, 1, 25, dtype=torch.bool)
    mask[0, ..., :7] = False
    heads = _Heads(3)
    ours, _ = varlen_sdpa_attention(heads, q, k, v, mask, scaling=0.25)
    theirs, _ = sdpa_attention_forward(heads, q, k, v, mask, scaling=0.25)
    assert torch.equal(ours, theirs)
    direct = decode_sdpa(q, k, v, mask, scale=0.25, groups=3)
    assert direct is not None
    assert torch.equal(direct.transpose(1, 2), theirs)


def test_a_long_left_masked_decode_window_is_attended_row_by_row_from_each_rows_first_column() -> None:
    """Rows of a long window, most of them masked on the left (episodes at different turns) and one with masked
    columns inside (a gap): each row's result is its attention over its own attended columns, computed alone."""
    g = torch.Generator().manual_seed(4)
    width = PER_ROW_MIN_WINDOW + 100
    cache_k, cache_v = (torch.randn(4, 2, width + 10, 16, generator=g) for _ in range(2))
    k, v = cache_k[:, :, 10:], cache_v[:, :, 10:]
    q = torch.randn(4, 6, 1, 16, generator=g)
    mask = torch.zeros(4, 1, 1, width, dtype=torch.bool)
    for row, first in enumerate((0, 150, 300, 200)):
        mask[row, ..., first:] = True
    mask[3, ..., 220:240] = False  # a gap
    assert row_windows(mask, 4) == [(0, True), (150, True), (300, True), (200, False)]
    out = decode_sdpa(q, k, v, mask, scale=0.25, groups=3)
    assert out is not None
    for row in range(4):
        cols = mask[row, 0, 0].nonzero().squeeze(-1)
        keys = k[row].repeat_interleave(3, dim=0)[:, cols]  # (H, n, D)
        values = v[row].repeat_interleave(3, dim=0)[:, cols]
        weights = torch.softmax(q[row] @ keys.transpose(-1, -2) * 0.25, dim=-1)  # Vaswani et al. 2017, eq. 1
        torch.testing.assert_close(out[row], weights @ values, atol=1e-6, rtol=1e-5)
    # A row's bits are its own: the same as attending it alone over its own columns, whatever the batch's window.
    alone = torch.nn.functional.scaled_dot_product_attention(
        q[1:2], k[1:2, :, 150:], v[1:2, :, 150:], scale=0.25, enable_gqa=True
    )
    assert torch.equal(out[1:2], alone)


def test_short_or_little_masked_windows_are_attended_in_one_call() -> None:
    mask = torch.ones(3, 1, 1, PER_ROW_MIN_WINDOW - 1, dtype=torch.bool)
    mask[0, ..., :200] = False
    assert row_windows(mask, 3) is None  # too short
    mask = torch.ones(3, 1, 1, PER_ROW_MIN_WINDOW * 2, dtype=torch.bool)
    mask[0, ..., : 3 * PER_ROW_MIN_MASKED - 3] = False
    assert row_windows(mask, 3) is None  # fewer than PER_ROW_MIN_MASKED masked columns per row on average
    mask[1, ..., :3] = False
    assert row_windows(mask, 3) is not None
    assert row_windows(None, 3) is None


def test_a_bf16_decode_step_attends_in_float32() -> None:
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, 4, n, 8, generator=g).to(torch.bfloat16) for n in (1, 12, 12))
    out = decode_sdpa(q, k[:, :2], v[:, :2], None, scale=None, groups=2)
    assert out is not None
    assert out.dtype == torch.bfloat16
    wide = torch.nn.functional.scaled_dot_product_attention(
        q.float(), k[:, :2].float(), v[:, :2].float(), enable_gqa=True
    )
    assert torch.equal(out, wide.to(torch.bfloat16))
    assert decode_sdpa(q.expand(2, 4, 3, 8), k, v, None, scale=None, groups=1) is None  # not a decode step


def test_varlen_sdpa_refuses_inconsistent_boundaries() -> None:
    q = torch.zeros(1, 2, 6, 4)
    cu = torch.tensor([0, 2, 6], dtype=torch.int32)
    heads = _Heads(1)
    with pytest.raises(ValueError, match="cu_seq_lens_q == cu_seq_lens_k"):
        varlen_sdpa_attention(heads, q, q, q, None, cu_seq_lens_q=cu)
    with pytest.raises(ValueError, match="not an attention mask as well"):
        varlen_sdpa_attention(heads, q, q, q, torch.ones(1, 1, 6, 6), cu_seq_lens_q=cu, cu_seq_lens_k=cu)
    bad = torch.tensor([0, 4, 4, 6], dtype=torch.int32)
    with pytest.raises(ValueError, match="rise strictly from 0 to 6"):
        varlen_sdpa_attention(heads, q, q, q, None, cu_seq_lens_q=bad, cu_seq_lens_k=bad)
    two_rows = torch.zeros(2, 2, 6, 4)
    with pytest.raises(ValueError, match="one packed row"):
        varlen_sdpa_attention(heads, two_rows, two_rows, two_rows, None, cu_seq_lens_q=cu, cu_seq_lens_k=cu)


def test_auto_picks_varlen_sdpa_off_cuda_and_flash_attention_2_is_refused_there() -> None:
    assert resolve_attn_implementation("auto", "cpu") == VARLEN_SDPA
    assert resolve_attn_implementation("sdpa", "cpu") == "sdpa"
    with pytest.raises(PolicyError, match="needs a CUDA device, the model is on 'cpu'"):
        resolve_attn_implementation("flash_attention_2", "cpu")


def test_flash_attention_2_without_flash_attn_names_the_install_command() -> None:
    pytest.importorskip("torch")
    try:
        import flash_attn  # noqa: F401  # pyright: ignore[reportMissingImports]
    except ImportError:
        pass
    else:
        pytest.skip("flash-attn is installed here")
    with pytest.raises(PolicyError, match="needs the flash-attn package: `uv pip install flash-attn"):
        resolve_attn_implementation("flash_attention_2", "cuda")


def test_policies_load_with_varlen_sdpa_by_default(tiny_dir: Path) -> None:
    assert Policy.from_pretrained(str(tiny_dir)).model.config._attn_implementation == VARLEN_SDPA  # pyright: ignore[reportAttributeAccessIssue]


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora+checkpointing"])
def test_packed_forward_gives_the_kernel_boundaries_and_no_mask(
    tiny_dir: Path, monkeypatch: pytest.MonkeyPatch, lora: bool
) -> None:
    policy = Policy.from_pretrained(
        str(tiny_dir), value_head=False, lora=LoraSettings(r=4) if lora else None, gradient_checkpointing=lora
    )
    policy.train()
    calls: list[tuple[bool, list[int]]] = []

    def recording(
        module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: Any, **kw: Any
    ):
        cu = kw.get("cu_seq_lens_q")
        calls.append((mask is None, [] if cu is None else cu.tolist()))
        return varlen_sdpa_attention(module, query, key, value, mask, **kw)

    monkeypatch.setitem(AttentionInterface._global_mapping, VARLEN_SDPA, recording)
    packed_forward(policy.model, _seqs(policy, [5, 9, 3]))
    model: Any = policy.model.get_base_model() if lora else policy.model  # pyright: ignore[reportCallIssue]
    assert calls == [(True, [0, 5, 14, 17])] * len(model.model.layers)


def _layout_grads(
    policy: Policy, seqs: list[list[int]], layout: Layout
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    for p in policy.trainable_parameters():
        p.grad = None
    out = policy_forward(policy, seqs, temperature=0.8, values=True, layout=layout)
    assert out.values is not None
    (out.logprobs.sum() + out.entropies.sum() + out.values.sum()).backward()
    grads = [p.grad.clone() for p in policy.trainable_parameters() if p.grad is not None]
    return torch.stack([out.logprobs, out.entropies, out.values]).detach(), grads


@pytest.mark.parametrize("implementation", [VARLEN_SDPA, "sdpa", "eager"])
def test_packed_equals_padded_and_each_sequence_alone_with_gradients(
    tiny_dir: Path, implementation: Any
) -> None:
    policy = Policy.from_pretrained(str(tiny_dir), attn_implementation=implementation)
    seqs = _seqs(policy, [7, 31, 2, 18, 1])
    packed, packed_grads = _layout_grads(policy, seqs, "packed")
    padded, padded_grads = _layout_grads(policy, seqs, "padded")
    with torch.no_grad():
        alone = torch.cat(
            [
                torch.stack([o.logprobs, o.entropies, o.values])
                for s in seqs
                if (o := policy.forward_packed([s], temperature=0.8)).values is not None
            ],
            dim=1,
        )
    torch.testing.assert_close(packed, padded, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(packed, alone, atol=1e-5, rtol=1e-5)
    assert len(packed_grads) == len(padded_grads) > 0
    for a, b in zip(packed_grads, padded_grads, strict=True):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)


def test_the_sampler_draws_the_same_tokens_with_varlen_sdpa_as_with_sdpa(tiny_dir: Path) -> None:
    prompts = [list(range(20, 20 + n)) for n in (5, 12, 8)]

    async def draw(policy: Policy) -> list[list[int]]:
        sampler = HFSampler(policy, SamplingParams(temperature=0.0), prefix_cache_mb=16)
        out: list[list[int]] = []
        with anyio.fail_after(120):
            for prompt in [*prompts, prompts[0] + [7, 8, 9]]:
                out.append((await sampler.sample(prompt, max_new_tokens=6)).token_ids)
        return out

    tokens = {
        impl: anyio.run(draw, Policy.from_pretrained(str(tiny_dir), attn_implementation=impl))
        for impl in (VARLEN_SDPA, "sdpa")
    }
    assert tokens[VARLEN_SDPA] == tokens["sdpa"]
    assert all(tokens["sdpa"])


def _tiny_qwen3_5(implementation: str, vocab_size: int = 256) -> Qwen3_5ForCausalLM:
    """A random 4-layer Qwen3.5 text model: gated delta net (linear attention) and full attention alternating."""
    config = Qwen3_5TextConfig(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        linear_key_head_dim=16,
        linear_value_head_dim=16,
        layer_types=["linear_attention", "full_attention", "linear_attention", "full_attention"],
    )
    config._attn_implementation = implementation
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return Qwen3_5ForCausalLM(config)


def test_a_hybrid_model_leaks_state_across_packed_sequences_so_packing_is_refused() -> None:
    model = _tiny_qwen3_5(VARLEN_SDPA).eval()
    seqs = [
        [int(t) for t in torch.randint(0, 256, (n,), generator=torch.Generator().manual_seed(n))]
        for n in (7, 13, 5)
    ]
    batch = pack_sequences(seqs)
    with torch.no_grad():
        packed = model.model(input_ids=batch.input_ids, position_ids=batch.position_ids).last_hidden_state[0]
        alone = torch.cat([model.model(input_ids=torch.tensor([s])).last_hidden_state[0] for s in seqs])
    # transformers' torch kernels for the linear-attention layers carry state over the sequence boundary.
    assert not torch.allclose(packed[7:], alone[7:], atol=1e-3)
    with pytest.raises(UnpackableModelError, match=r"'linear_attention' layers .* \(optim.layout: padded\)"):
        packed_forward(model, seqs)
    with pytest.raises(UnpackableModelError):
        check_packable(model)


def test_a_hybrid_model_padded_equals_each_sequence_alone_with_gradients() -> None:
    model = _tiny_qwen3_5(VARLEN_SDPA)
    seqs = [
        [int(t) for t in torch.randint(0, 256, (n,), generator=torch.Generator().manual_seed(n))]
        for n in (7, 13, 5)
    ]

    def run(batches: list[list[list[int]]]) -> tuple[torch.Tensor, list[torch.Tensor]]:
        model.zero_grad(set_to_none=True)
        outs = [padded_forward(model, b) for b in batches]
        logprobs = torch.cat([o.logprobs for o in outs])
        entropies = torch.cat([o.entropies for o in outs])
        (logprobs.sum() + entropies.sum()).backward()
        grads = [p.grad.clone() for p in model.parameters() if p.grad is not None]
        return torch.stack([logprobs, entropies]).detach(), grads

    together, together_grads = run([seqs])
    alone, alone_grads = run([[s] for s in seqs])
    torch.testing.assert_close(together, alone, atol=1e-5, rtol=1e-5)
    for a, b in zip(together_grads, alone_grads, strict=True):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)


def test_the_reference_of_a_hybrid_model_runs_padded_and_equals_each_sequence_alone(tiny_dir: Path) -> None:
    tokenizer = Policy.from_pretrained(str(tiny_dir), value_head=False).tokenizer
    model = _tiny_qwen3_5(VARLEN_SDPA, vocab_size=len(tokenizer))
    policy = Policy(model=model, tokenizer=tokenizer, value_head=None, base_model="random qwen3.5")
    reference = ReferencePolicy.for_policy(policy)
    seqs = _seqs(policy, [9, 4, 15])
    together = reference.logprobs(seqs, temperature=0.9).logprobs
    alone = torch.cat([reference.logprobs([s], temperature=0.9).logprobs for s in seqs])
    torch.testing.assert_close(together, alone, atol=1e-5, rtol=1e-5)


@pytest.mark.gpu
def test_flash_attention_2_packed_forward_matches_padded_on_cuda(tiny_dir: Path) -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    pytest.importorskip(
        "flash_attn", reason="needs flash-attn (`uv pip install flash-attn --no-build-isolation`)"
    )
    policy = Policy.from_pretrained(
        str(tiny_dir), device="cuda", dtype="bfloat16", attn_implementation="auto"
    )
    assert policy.model.config._attn_implementation == "flash_attention_2"  # pyright: ignore[reportAttributeAccessIssue]
    seqs = _seqs(policy, [7, 31, 2, 18, 1])
    with torch.no_grad():
        packed = policy_forward(policy, seqs, temperature=1.0, values=False, layout="packed")
        padded = policy_forward(policy, seqs, temperature=1.0, values=False, layout="padded")
    torch.testing.assert_close(packed.logprobs, padded.logprobs, atol=5e-2, rtol=5e-2)
