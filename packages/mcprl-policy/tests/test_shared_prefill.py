"""Identical prompts admitted together are prefilled once; each request then runs as if it had been alone.

Real models throughout: the embedded ``tiny-8h`` (the demo's shape), a Qwen3 stand-in under a LoRA adapter with
random B, and a Qwen3.5 hybrid stand-in (linear-attention layers: recurrent states are copied, not keys). What
is exact: a duplicate row's cache state and first draw equal those of its prompt prefilled in a batch of the
same shape as its admission's distinct prompts (a CPU matmul's bits depend on the row count, so "alone" means
"in a prefill of that shape"). What holds to float tolerance: each request's whole continuation against an
engine that runs only that request (different batch shapes throughout).
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path

import anyio
import pytest
import torch
from decode_testkit import build_engine, prompt_ids, tool_turn_ids
from peft import LoraConfig, PeftModel, get_peft_model
from torch import nn
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerBase

from mcprl_policy import Completion, HFSampler, Policy, SamplingParams, build_tiny_model
from mcprl_policy.batch_cache import KVLayout
from mcprl_policy.cache_rows import AttentionRow, RecurrentRow, RowState
from mcprl_policy.decode import DecodeEngine, DecodeRequest
from mcprl_policy.shared_prefill import SharedPrompts
from mcprl_policy.standin import standin_model

Model = tuple[nn.Module, PreTrainedTokenizerBase]

SAMPLED = SamplingParams(temperature=1.0, top_k=50, repetition_penalty=1.2)


@pytest.fixture(scope="module")
def tiny_8h(tmp_path_factory: pytest.TempPathFactory) -> Model:
    directory = build_tiny_model("tiny-8h", cache_dir=tmp_path_factory.mktemp("models"))
    return AutoModelForCausalLM.from_pretrained(directory).eval(), AutoTokenizer.from_pretrained(directory)


def _standin(architecture: str, tokenizer: PreTrainedTokenizerBase) -> nn.Module:
    return standin_model(
        "qwen3" if architecture == "qwen3" else "qwen3.5",
        vocab_size=len(tokenizer),
        eos_token_id=int(tokenizer.convert_tokens_to_ids("<|im_end|>")),  # pyright: ignore[reportArgumentType]
        pad_token_id=int(tokenizer.pad_token_id),  # pyright: ignore[reportArgumentType]
        initializer_range=0.2,
    )


@pytest.fixture(scope="module")
def qwen3_lora(tiny_dir: Path) -> Model:
    tokenizer = AutoTokenizer.from_pretrained(tiny_dir)
    torch.manual_seed(4)
    lora = LoraConfig(
        r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj"], init_lora_weights=False
    )
    model = get_peft_model(_standin("qwen3", tokenizer), lora)  # pyright: ignore[reportArgumentType]
    assert isinstance(model, PeftModel)
    return model.eval(), tokenizer


@pytest.fixture(scope="module")
def hybrid(tiny_dir: Path) -> Model:
    tokenizer = AutoTokenizer.from_pretrained(tiny_dir)
    return _standin("qwen3.5", tokenizer).eval(), tokenizer


# (model fixture, kv layout, under CPU bf16 autocast)
CASES = [
    ("tiny_8h", "pool", False),
    ("tiny_8h", "concat", False),
    ("qwen3_lora", "pool", False),
    ("qwen3_lora", "pool", True),
    ("hybrid", "concat", False),
]


def _autocast(bf16: bool) -> AbstractContextManager[object]:
    return torch.autocast("cpu", dtype=torch.bfloat16) if bf16 else nullcontext()


def _engine(
    model: Model, layout: KVLayout, *, params: SamplingParams = SAMPLED, rows: int = 8
) -> DecodeEngine:
    return build_engine(*model, params=params, max_batch_size=rows, kv_layout=layout)


def _admit(engine: DecodeEngine, requests: list[DecodeRequest], bf16: bool) -> None:
    """One admission of ``requests`` (prefill and first draw), leaving them in the running rows."""
    with torch.inference_mode(), _autocast(bf16):
        engine._admit(requests, engine.device)  # pyright: ignore[reportPrivateUsage]


def _row(engine: DecodeEngine, i: int) -> tuple[RowState, ...]:
    return engine._cache.row_state(i)  # pyright: ignore[reportPrivateUsage]


def _assert_same_state(a: tuple[RowState, ...], b: tuple[RowState, ...]) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        match x, y:
            case AttentionRow(), AttentionRow():
                assert torch.equal(x.keys, y.keys)
                assert torch.equal(x.values, y.values)
            case RecurrentRow(), RecurrentRow():
                assert torch.equal(x.conv, y.conv)
                assert torch.equal(x.recurrent, y.recurrent)
            case _:
                raise AssertionError(f"layer kinds differ: {type(x).__name__}, {type(y).__name__}")


def test_shared_prompts_group_requests_by_token_ids_in_admission_order() -> None:
    a, b, c, d, e = (DecodeRequest(prompt_ids=p, max_new_tokens=1) for p in ([1, 2], [3], [1, 2], [1], [3]))
    shared = SharedPrompts([a, b, c, d, e])
    assert shared.leaders == [a, b, d]
    assert shared.rows([b, a]) == ([a, b, c, e], [1, 0, 1, 0])
    assert shared.rows([d]) == ([d], [0])
    with pytest.raises(ValueError, match="leads no prompt"):
        shared.rows([c])


@pytest.mark.parametrize(("model_name", "layout", "bf16"), CASES)
def test_duplicates_start_from_the_bits_of_their_prompt_prefilled_in_a_batch_of_the_same_shape(
    model_name: str, layout: KVLayout, bf16: bool, request: pytest.FixtureRequest
) -> None:
    model: Model = request.getfixturevalue(model_name)
    tokenizer = model[1]
    a, b = prompt_ids(tokenizer, 3), prompt_ids(tokenizer, 6)
    assert len(a) != len(b)  # the shorter prompt is padded in both prefills
    seeds = (11, 12, 13, 14, 15)
    engine = _engine(model, layout)
    requests = [
        DecodeRequest(prompt_ids=p, max_new_tokens=8, seed=s)
        for p, s in zip((a, b, a, a, b), seeds, strict=True)
    ]
    _admit(engine, requests, bf16)
    assert engine.stats.prefill_rows == 2
    assert engine.stats.shared_rows == 3
    assert engine.stats.shared_tokens == 2 * len(a) + len(b)
    for i, own in enumerate(requests):
        # The distinct prompts prefilled as a batch of their own, this request's prompt carrying its seed.
        pair = [
            DecodeRequest(prompt_ids=p, max_new_tokens=8, seed=own.seed if p == own.prompt_ids else 0)
            for p in (a, b)
        ]
        reference = _engine(model, layout)
        _admit(reference, pair, bf16)
        mine = 0 if own.prompt_ids == a else 1
        assert own.token_ids == pair[mine].token_ids
        assert own.logprobs == pair[mine].logprobs
        _assert_same_state(_row(engine, i), _row(reference, mine))


def _requests(tokenizer: PreTrainedTokenizerBase) -> list[DecodeRequest]:
    """A group of four on one prompt, a group of two on another and a single, each request seeded."""
    prompts = [prompt_ids(tokenizer, 1)] * 4 + [prompt_ids(tokenizer, 7)] * 2 + [prompt_ids(tokenizer, 2)]
    return [
        DecodeRequest(prompt_ids=p, max_new_tokens=(12, 20, 7, 16, 18, 9, 14)[i], seed=100 + i)
        for i, p in enumerate(prompts)
    ]


def _run(engine: DecodeEngine, requests: Sequence[DecodeRequest]) -> None:
    engine.pending.extend(requests)
    while not engine.idle:
        engine.run_until_finished()


def _alone(model: Model, layout: KVLayout, params: SamplingParams, request: DecodeRequest) -> DecodeRequest:
    twin = DecodeRequest(
        prompt_ids=request.prompt_ids, max_new_tokens=request.max_new_tokens, seed=request.seed
    )
    _run(_engine(model, layout, params=params, rows=1), [twin])
    return twin


def _assert_as_alone(
    model: Model, layout: KVLayout, requests: Sequence[DecodeRequest], *, params: SamplingParams = SAMPLED
) -> None:
    """Same tokens; logprobs within 1e-5 (and 1e-5 of their size: the hybrid's run to -5)."""
    for request in requests:
        alone = _alone(model, layout, params, request)
        assert request.token_ids == alone.token_ids
        assert request.finish_reason == alone.finish_reason
        torch.testing.assert_close(
            torch.tensor(request.logprobs), torch.tensor(alone.logprobs), atol=1e-5, rtol=1e-5
        )


@pytest.mark.parametrize(("model_name", "layout"), [(m, layout) for m, layout, bf16 in CASES if not bf16])
def test_each_request_of_a_group_continues_as_an_engine_running_it_alone(
    model_name: str, layout: KVLayout, request: pytest.FixtureRequest
) -> None:
    model: Model = request.getfixturevalue(model_name)
    engine = _engine(model, layout)
    first = _requests(model[1])
    _run(engine, first)
    assert engine.stats.prefill_rows == 3
    assert engine.stats.shared_rows == 4
    # The group members drew their own tokens from one prefill.
    assert len({tuple(r.token_ids) for r in first[:4]}) > 1
    _assert_as_alone(model, layout, first)
    # Next turns: the same next prompt three times resumes one cached prefix and prefills its tail once.
    tool = tool_turn_ids(model[1], 0)
    second = [
        DecodeRequest(
            prompt_ids=[*first[4].prompt_ids, *first[4].token_ids, *tool], max_new_tokens=n, seed=200 + n
        )
        for n in (6, 13, 9)
    ]
    cached = len(first[4].prompt_ids) + len(first[4].token_ids) - 1  # its prompt and every token fed back
    before = engine.stats.prefill_tokens
    _run(engine, second)
    assert (engine.stats.prefix_hits, engine.stats.prefix_tokens) == (3, 3 * cached)
    assert engine.stats.shared_rows == 6
    assert engine.stats.prefill_tokens - before == len(second[0].prompt_ids) - cached
    _assert_as_alone(model, layout, second)


def test_unseeded_and_greedy_duplicates_share_one_prefill_too(tiny_8h: Model) -> None:
    params = SamplingParams(temperature=0.0, repetition_penalty=1.3)
    greedy = _engine(tiny_8h, "pool", params=params)
    requests = [DecodeRequest(prompt_ids=prompt_ids(tiny_8h[1], 4), max_new_tokens=10) for _ in range(3)]
    _run(greedy, requests)
    assert greedy.stats.prefill_rows == 1
    assert greedy.stats.shared_rows == 2
    assert requests[0].token_ids == requests[1].token_ids == requests[2].token_ids
    _assert_as_alone(tiny_8h, "pool", requests[:1], params=params)
    # Unseeded rows draw from the engine's generator, one draw per row: copies sample their own tokens.
    sampled = _engine(tiny_8h, "pool", params=SamplingParams(temperature=1.5, seed=5))
    requests = [DecodeRequest(prompt_ids=prompt_ids(tiny_8h[1], 4), max_new_tokens=10) for _ in range(6)]
    _run(sampled, requests)
    assert sampled.stats.prefill_rows == 1
    assert sampled.stats.shared_rows == 5
    assert len({tuple(r.token_ids) for r in requests}) > 1


def test_a_padded_rows_repetition_penalty_does_not_count_the_pad(tiny_8h: Model) -> None:
    model, tokenizer = tiny_8h
    pad = int(tokenizer.pad_token_id)  # pyright: ignore[reportArgumentType]
    short, long = prompt_ids(tokenizer, 0), prompt_ids(tokenizer, 4)
    assert len(short) < len(long)
    assert pad not in short
    engine = _engine(tiny_8h, "pool", params=SamplingParams(temperature=0.0, repetition_penalty=1.3))
    _admit(engine, [DecodeRequest(prompt_ids=p, max_new_tokens=5) for p in (short, long)], False)
    seen = engine._seen  # pyright: ignore[reportPrivateUsage]
    assert seen is not None
    first = engine.active[0].token_ids[0]
    assert sorted(seen[0].nonzero().squeeze(-1).tolist()) == sorted({*short, first})
    del model


def test_the_hf_sampler_reports_the_prompt_tokens_it_did_not_prefill_again(tiny_dir: Path) -> None:
    policy = Policy.from_pretrained(tiny_dir, value_head=False)
    group = 4
    sampler = HFSampler(policy, SamplingParams(temperature=1.0), max_batch_size=group, max_wait_ms=60_000)
    prompt = prompt_ids(policy.tokenizer, 5)

    async def sample_group() -> list[Completion]:
        results: list[Completion] = []

        async def one(seed: int) -> None:
            results.append(await sampler.sample(prompt, max_new_tokens=4, seed=seed))

        with anyio.fail_after(120):
            async with anyio.create_task_group() as tg:
                for seed in range(group):
                    tg.start_soon(one, seed)
        return results

    assert len(anyio.run(sample_group)) == group
    metrics = sampler.metrics()
    assert metrics["sampler/prefill_tokens"] == len(prompt)
    assert metrics["sampler/shared_prefill_tokens"] == (group - 1) * len(prompt)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_cuda_each_request_of_a_group_continues_as_an_engine_running_it_alone(tiny_dir: Path) -> None:
    policy = Policy.from_pretrained(str(tiny_dir), device="cuda", value_head=False)
    model: Model = (policy.model.eval(), policy.tokenizer)
    engine = _engine(model, "pool")
    first = _requests(model[1])
    _run(engine, first)
    assert engine.stats.shared_rows == 4
    _assert_as_alone(model, "pool", first)
