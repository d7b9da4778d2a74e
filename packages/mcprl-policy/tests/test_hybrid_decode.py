"""The HF sampler on a Qwen3.5-style hybrid model: linear-attention (gated delta net) and full-attention layers.

The model is a real ``Qwen3_5ForCausalLM`` (random weights, four layers alternating linear and full attention)
with the embedded tiny tokenizer, run through transformers' reference PyTorch kernels (no fla or
causal-conv1d here). The reference for exactness is transformers' own ``generate`` on each prompt alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import anyio
import pytest
import torch
from decode_testkit import build_engine
from transformers import (
    AutoTokenizer,
    PreTrainedModel,
    Qwen3_5ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
    Qwen3NextConfig,
    Qwen3NextForCausalLM,
)
from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5GatedDeltaNet

from mcprl_policy import Completion, HFSampler, Policy, SamplerError, SamplingParams, policy_forward
from mcprl_policy.cache_rows import AttentionRow, RecurrentRow
from mcprl_policy.decode import DecodeEngine, DecodeRequest
from mcprl_policy.prefix_blocks import BLOCK_TOKENS, common_length
from mcprl_policy.standin import standin_model


@pytest.fixture(scope="module")
def hybrid_dir(tiny_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    tokenizer = AutoTokenizer.from_pretrained(tiny_dir)
    model = standin_model(
        "qwen3.5",
        vocab_size=len(tokenizer),
        eos_token_id=int(tokenizer.convert_tokens_to_ids("<|im_end|>")),
        pad_token_id=int(tokenizer.pad_token_id),
        initializer_range=0.2,
    )
    directory = tmp_path_factory.mktemp("hybrid")
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


@pytest.fixture(scope="module")
def policy(hybrid_dir: Path) -> Policy:
    policy = Policy.from_pretrained(str(hybrid_dir))
    assert _hybrid(policy).config.layer_types == ["linear_attention", "full_attention"] * 2
    return policy


def _hybrid(policy: Policy) -> Qwen3_5ForCausalLM:
    assert isinstance(policy.model, Qwen3_5ForCausalLM)
    return policy.model


def _stop(policy: Policy) -> int:
    eos = _hybrid(policy).config.eos_token_id
    assert isinstance(eos, int)
    return eos


def _prompts(policy: Policy, n: int) -> list[list[int]]:
    return [
        policy.tokenizer.apply_chat_template(
            [{"role": "user", "content": f"What is {i} times the price of ACME?" + " Please." * (i % 4)}],
            add_generation_prompt=True,
            tokenize=True,
            return_dict=False,
        )
        for i in range(n)
    ]


def _next_turn(policy: Policy, prompt: list[int], completion: Sequence[int], i: int) -> list[int]:
    tool = policy.tokenizer.apply_chat_template(
        [{"role": "tool", "content": f'{{"price": {i}.5}}' * (1 + i % 3)}],
        add_generation_prompt=True,
        tokenize=True,
        return_dict=False,
    )
    return [*prompt, *completion, *tool]


def _generate_alone(model: PreTrainedModel, prompt: list[int], n: int, stop: int) -> list[int]:
    """transformers' greedy ``generate`` on one unpadded prompt, stopping at ``stop`` as the engine does."""
    ids = torch.tensor([prompt], device=model.device)
    with torch.no_grad():
        out = model.generate(  # pyright: ignore[reportCallIssue]
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=n,
            do_sample=False,
            eos_token_id=stop,
            pad_token_id=stop,
        )
    tokens: list[int] = out[0, len(prompt) :].tolist()
    return tokens[: tokens.index(stop) + 1] if stop in tokens else tokens


def _engine(policy: Policy, *, max_batch_size: int, prefix_cache_bytes: int) -> DecodeEngine:
    return build_engine(
        policy.model,
        policy.tokenizer,
        params=SamplingParams(temperature=0.0),
        max_batch_size=max_batch_size,
        prefix_cache_bytes=prefix_cache_bytes,
        stop_token_ids=frozenset({_stop(policy)}),
    )


def _run(engine: DecodeEngine, requests: Sequence[DecodeRequest], *, join_after: int) -> None:
    """Queue the first ``join_after`` requests, run one engine call, then queue the rest: they join a batch
    that is decoding (and that rows leave as they finish)."""
    engine.pending.extend(requests[:join_after])
    engine.run_until_finished()
    engine.pending.extend(requests[join_after:])
    while not engine.idle:
        engine.run_until_finished()


def test_greedy_with_joins_and_leaves_equals_generate_for_each_prompt_alone(policy: Policy) -> None:
    prompts = [p + p[-3:] * i for i, p in enumerate(_prompts(policy, 7))]  # lengths 16..50
    max_new = [9, 3, 14, 6, 11, 4, 8]
    engine = _engine(policy, max_batch_size=4, prefix_cache_bytes=0)
    requests = [DecodeRequest(prompt_ids=p, max_new_tokens=n) for p, n in zip(prompts, max_new, strict=True)]
    _run(engine, requests, join_after=3)
    assert engine.stats.max_rows == 4  # joined mid-batch, capped at 4
    assert engine.stats.prefill_calls >= 3
    stop = _stop(policy)
    for request, n in zip(requests, max_new, strict=True):
        assert request.token_ids == _generate_alone(_hybrid(policy), request.prompt_ids, n, stop)
    assert len({len(r.token_ids) for r in requests}) > 3  # rows left the batch at different steps


def test_next_turns_resume_the_recurrent_state_and_equal_generate(policy: Policy) -> None:
    engine = _engine(policy, max_batch_size=8, prefix_cache_bytes=2**26)
    prompts = _prompts(policy, 5)
    first = [DecodeRequest(prompt_ids=p, max_new_tokens=4 + i) for i, p in enumerate(prompts)]
    _run(engine, first, join_after=2)
    # Tool responses of different lengths (and two of equal length, which prefill together).
    second = [
        DecodeRequest(prompt_ids=_next_turn(policy, r.prompt_ids, r.token_ids, i % 4), max_new_tokens=6)
        for i, r in enumerate(first)
    ]
    calls = engine.stats.prefill_calls
    _run(engine, second, join_after=5)
    assert engine.stats.prefix_hits == 5
    assert engine.stats.prefix_tokens == sum(len(r.prompt_ids) + len(r.token_ids) - 1 for r in first)
    tails = {
        len(r.prompt_ids) - len(f.prompt_ids) - len(f.token_ids) for r, f in zip(second, first, strict=True)
    }
    assert engine.stats.prefill_calls - calls == len(tails) < 5
    stop = _stop(policy)
    for request in second:
        assert request.token_ids == _generate_alone(_hybrid(policy), request.prompt_ids, 6, stop)


def test_a_pad_between_a_recurrent_state_and_its_continuation_changes_the_output(
    policy: Policy, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Why continuations of different lengths prefill apart: batched together, the shorter ones get masked pads
    after their cached state, and a pad still decays the gated delta net's state."""
    engine = _engine(policy, max_batch_size=8, prefix_cache_bytes=2**26)
    prompts = _prompts(policy, 4)
    first = [DecodeRequest(prompt_ids=p, max_new_tokens=5) for p in prompts]
    _run(engine, first, join_after=4)
    monkeypatch.setattr(engine, "_cached_groups", lambda hits: [hits] if hits else [])  # pyright: ignore[reportUnknownLambdaType]
    second = [
        DecodeRequest(prompt_ids=_next_turn(policy, r.prompt_ids, r.token_ids, i), max_new_tokens=1)
        for i, r in enumerate(first)
    ]
    _run(engine, second, join_after=4)
    assert engine.stats.prefix_hits == 4
    with torch.no_grad():
        whole = [policy.model(torch.tensor([r.prompt_ids])).logits[0, -1].log_softmax(-1) for r in second]
    errors = [abs(r.logprobs[0] - float(lp[r.token_ids[0]])) for r, lp in zip(second, whole, strict=True)]
    longest = max(range(4), key=lambda i: len(second[i].prompt_ids) - len(first[i].prompt_ids))
    assert errors[longest] < 1e-4  # no pad after its state
    assert max(errors) > 1e-2, errors


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_sampler_logprobs_over_turns_equal_the_learners_padded_forward(
    policy: Policy, temperature: float
) -> None:
    params = SamplingParams(temperature=temperature, seed=5)
    sampler = HFSampler(policy, params, max_batch_size=3, max_wait_ms=0, prefix_cache_mb=64)
    prompts = _prompts(policy, 5)

    async def sample(batch: Sequence[list[int]], n: int) -> list[Completion]:
        results: dict[int, Completion] = {}

        async def one(i: int) -> None:
            results[i] = await sampler.sample(batch[i], max_new_tokens=n + i, seed=100 + i)

        with anyio.fail_after(120):
            async with anyio.create_task_group() as tg:
                for i in range(len(batch)):
                    tg.start_soon(one, i)
        return [results[i] for i in range(len(batch))]

    first = anyio.run(sample, prompts, 4)
    second_prompts = [
        _next_turn(policy, p, c.token_ids, i) for i, (p, c) in enumerate(zip(prompts, first, strict=True))
    ]
    second = anyio.run(sample, second_prompts, 5)
    assert sampler.metrics()["sampler/prefix_hits"] == 5
    with torch.no_grad():
        out = policy_forward(
            policy,
            [p + c.token_ids for p, c in zip(second_prompts, second, strict=True)],
            temperature=1.0,
            values=False,
            layout="padded",
        )
    for prompt, completion, logprobs in zip(second_prompts, second, out.split("logprobs"), strict=True):
        torch.testing.assert_close(
            logprobs[len(prompt) :], torch.tensor(completion.logprobs), atol=1e-4, rtol=0.0
        )


def test_cached_prefixes_hold_a_recurrent_state_per_linear_layer(policy: Policy) -> None:
    engine = _engine(policy, max_batch_size=2, prefix_cache_bytes=2**26)
    request = DecodeRequest(prompt_ids=_prompts(policy, 1)[0], max_new_tokens=3)
    _run(engine, [request], join_after=1)
    consumed = [*request.prompt_ids, *request.token_ids[:-1]]
    entry = engine.prefix.lookup([*consumed, 7])
    assert entry is not None
    assert entry.length == len(consumed)
    assert [type(layer) for layer in entry.layers] == [RecurrentRow, AttentionRow] * 2
    recurrent = entry.layers[0]
    assert isinstance(recurrent, RecurrentRow)
    linear = _hybrid(policy).model.layers[0].linear_attn
    assert isinstance(linear, Qwen3_5GatedDeltaNet)
    assert recurrent.conv.shape == (linear.conv_dim, linear.conv_kernel_size)
    assert engine.prefix.lookup([*consumed[:-1], 7]) is None  # a state is never resumed before its end


def _build_engine(model: torch.nn.Module) -> DecodeEngine:
    return DecodeEngine(
        model,
        params=SamplingParams(),
        stop_token_ids=frozenset({1}),
        pad_token_id=0,
        max_batch_size=2,
        decode=str,
    )


def test_sliding_window_caches_are_refused_when_the_engine_is_built() -> None:
    sliding = Qwen3ForCausalLM(
        Qwen3Config(
            vocab_size=64,
            hidden_size=16,
            intermediate_size=32,
            num_hidden_layers=2,
            num_attention_heads=2,
            num_key_value_heads=1,
            head_dim=8,
            use_sliding_window=True,
            sliding_window=8,
            max_window_layers=0,
        )
    )
    assert "sliding_attention" in (sliding.config.layer_types or [])
    with pytest.raises(SamplerError, match=r"layer types \['sliding_attention'\].*sampler.backend=vllm"):
        _build_engine(sliding)


def test_linear_attention_of_an_unverified_model_type_is_refused() -> None:
    """Qwen3-Next has the same layer kinds as Qwen3.5, but its padding behaviour is not covered by these tests."""
    config = Qwen3NextConfig(
        vocab_size=64,
        hidden_size=16,
        intermediate_size=32,
        moe_intermediate_size=16,
        shared_expert_intermediate_size=16,
        num_experts=2,
        num_experts_per_tok=1,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=8,
        linear_num_key_heads=1,
        linear_num_value_heads=2,
        linear_key_head_dim=8,
        linear_value_head_dim=8,
        layer_types=["linear_attention", "full_attention"],
    )
    with pytest.raises(SamplerError, match=r"linear-attention layers only in .*'qwen3_next'"):
        _build_engine(Qwen3NextForCausalLM(config))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_hybrid_sampler_on_cuda_equals_generate_and_the_learners_logprobs(hybrid_dir: Path) -> None:
    """On CUDA transformers may use the fla / causal-conv1d kernels when installed; the engine's cache handling
    must agree with them as with the PyTorch reference."""
    policy = Policy.from_pretrained(str(hybrid_dir), device="cuda")
    engine = _engine(policy, max_batch_size=3, prefix_cache_bytes=2**26)
    prompts = _prompts(policy, 5)
    first = [DecodeRequest(prompt_ids=p, max_new_tokens=4 + i) for i, p in enumerate(prompts)]
    _run(engine, first, join_after=2)
    second = [
        DecodeRequest(prompt_ids=_next_turn(policy, r.prompt_ids, r.token_ids, i), max_new_tokens=6)
        for i, r in enumerate(first)
    ]
    _run(engine, second, join_after=3)
    assert engine.stats.prefix_hits == 5
    stop = _stop(policy)
    for request in [*first, *second]:
        assert request.token_ids == _generate_alone(
            _hybrid(policy), request.prompt_ids, request.max_new_tokens, stop
        )
    with torch.no_grad():
        out = policy_forward(
            policy,
            [r.prompt_ids + r.token_ids for r in second],
            temperature=1.0,
            values=False,
            layout="padded",
        )
    for request, logprobs in zip(second, out.split("logprobs"), strict=True):
        torch.testing.assert_close(
            logprobs[len(request.prompt_ids) :].cpu(), torch.tensor(request.logprobs), atol=2e-3, rtol=0.0
        )


def test_prompts_sharing_only_a_prefix_never_resume_a_recurrent_state(policy: Policy) -> None:
    system = "You are an agent that answers with tools. " * 12
    prompts = [
        policy.tokenizer.apply_chat_template(
            [{"role": "system", "content": system}, {"role": "user", "content": f"Price of stock {i}?"}],
            add_generation_prompt=True,
            tokenize=True,
            return_dict=False,
        )
        for i in range(4)
    ]
    assert common_length(prompts[0], prompts[1]) >= 2 * BLOCK_TOKENS
    engine = _engine(policy, max_batch_size=4, prefix_cache_bytes=2**26)
    requests = [DecodeRequest(prompt_ids=p, max_new_tokens=5) for p in prompts]
    _run(engine, requests[:1], join_after=1)
    _run(engine, requests[1:], join_after=1)  # the first finished; the last two are admitted together
    assert engine.stats.prefix_hits == 0
    assert engine.stats.shared_tokens == 0
    assert engine.stats.prefill_tokens == sum(len(p) for p in prompts)
    stop = _stop(policy)
    for request in requests:
        assert request.token_ids == _generate_alone(_hybrid(policy), request.prompt_ids, 5, stop)
