"""The lean decode forward against the model's own forward: the same workload gives the same bits.

Both run through the same `DecodeEngine` over the same `KVPool`; only the decode step's forward differs. The
models are real transformers models: the embedded ``tiny-8h`` (the demo's Qwen3 shape), and seeded random-weight
stand-ins built here with the embedded tokenizer: a Qwen3 with grouped-query attention, a Qwen2 (q/k/v biases),
a Llama 3 (grouped-query attention, llama3 RoPE scaling) under a peft LoRA adapter whose B matrices are random
(so the adapter changes the logits), and a bfloat16 Qwen3. The workload mixes everything the engine does between
steps: joins, leaves at 2-30 tokens, prefix-cache hits on next turns, stop strings, repetition penalty, greedy,
seeded and unseeded sampling. Tokens, logprobs and finish reasons must be equal (logprobs bit for bit).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any, TypedDict

import attrs
import pytest
import torch
from decode_testkit import WORKLOAD_PARAMS, build_engine, drain, mixed_workload, prompt_ids
from peft import LoraConfig, PeftModel, get_peft_model
from torch import nn
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    DynamicCache,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedTokenizerBase,
    Qwen2Config,
    Qwen2ForCausalLM,
)
from transformers.models.qwen3.modeling_qwen3 import Qwen3DecoderLayer

from mcprl_policy import HFSampler, Policy, SamplerError, SamplingParams, build_tiny_model
from mcprl_policy.config import DecodeForward
from mcprl_policy.decode import DecodeEngine, DecodeRequest
from mcprl_policy.kv_pool import KVPool
from mcprl_policy.lean_decode import LeanDecoder, lean_unsupported_reason
from mcprl_policy.standin import standin_model

Model = tuple[nn.Module, PreTrainedTokenizerBase]


@pytest.fixture(scope="module")
def tokenizer(tiny_dir: Path) -> PreTrainedTokenizerBase:
    return AutoTokenizer.from_pretrained(tiny_dir)


class _Ids(TypedDict):
    vocab_size: int
    eos_token_id: int
    pad_token_id: int


def _ids(tokenizer: PreTrainedTokenizerBase) -> _Ids:
    return {
        "vocab_size": len(tokenizer),
        "eos_token_id": int(tokenizer.convert_tokens_to_ids("<|im_end|>")),  # pyright: ignore[reportArgumentType]
        "pad_token_id": int(tokenizer.pad_token_id),  # pyright: ignore[reportArgumentType]
    }


@pytest.fixture(scope="module")
def tiny_8h(tmp_path_factory: pytest.TempPathFactory) -> Model:
    directory = build_tiny_model("tiny-8h", cache_dir=tmp_path_factory.mktemp("models"))
    return AutoModelForCausalLM.from_pretrained(directory).eval(), AutoTokenizer.from_pretrained(directory)


@pytest.fixture(scope="module")
def qwen3_gqa(tokenizer: PreTrainedTokenizerBase) -> Model:
    model = standin_model("qwen3", initializer_range=0.2, **_ids(tokenizer))
    assert model.config.num_key_value_heads < model.config.num_attention_heads
    return model.eval(), tokenizer


@pytest.fixture(scope="module")
def qwen3_bf16(tokenizer: PreTrainedTokenizerBase) -> Model:
    model = standin_model("qwen3", initializer_range=0.2, seed=1, **_ids(tokenizer))
    model.bfloat16()
    return model.eval(), tokenizer


@pytest.fixture(scope="module")
def qwen2_bias(tokenizer: PreTrainedTokenizerBase) -> Model:
    config = Qwen2Config(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        initializer_range=0.2,
        **_ids(tokenizer),
    )
    torch.manual_seed(2)
    model = Qwen2ForCausalLM(config)
    with torch.no_grad():  # random biases: transformers initialises them to zero
        for name, parameter in model.named_parameters():
            if name.endswith("_proj.bias"):
                parameter.normal_(0.0, 0.5)
    return model.eval(), tokenizer


@pytest.fixture(scope="module")
def llama_lora(tokenizer: PreTrainedTokenizerBase) -> Model:
    config = LlamaConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=131_072,
        rope_parameters={
            "rope_type": "llama3",
            "rope_theta": 500_000.0,
            "factor": 32.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64,
        },
        tie_word_embeddings=True,
        initializer_range=0.2,
        **_ids(tokenizer),
    )
    torch.manual_seed(3)
    lora = LoraConfig(
        r=4,
        lora_alpha=8,
        target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
        init_lora_weights=False,  # random B: the adapter changes the logits
    )
    model = get_peft_model(LlamaForCausalLM(config), lora)
    assert isinstance(model, PeftModel)
    return model.eval(), tokenizer


def _engine(
    model: Model, params: SamplingParams, decode_forward: DecodeForward, *, max_batch_size: int = 5
) -> DecodeEngine:
    return build_engine(*model, params=params, max_batch_size=max_batch_size, decode_forward=decode_forward)


@pytest.fixture
def threads(request: pytest.FixtureRequest) -> Iterator[int]:
    before = torch.get_num_threads()
    torch.set_num_threads(request.param)
    yield request.param
    torch.set_num_threads(before)


@pytest.mark.parametrize(
    ("model_name", "case", "threads"),
    [("tiny_8h", case, 1) for case in WORKLOAD_PARAMS]
    + [("tiny_8h", "sampled, seeded and not", 2)]
    + [
        (name, "sampled, penalty, stop string", 1)
        for name in ("qwen3_gqa", "qwen2_bias", "llama_lora", "qwen3_bf16")
    ]
    + [("llama_lora", "greedy, penalty, stop string", 2)],
    indirect=["threads"],
)
def test_the_lean_forward_gives_the_model_forwards_tokens_and_logprobs_bit_for_bit(
    model_name: str, case: str, threads: int, request: pytest.FixtureRequest
) -> None:
    del threads
    model: Model = request.getfixturevalue(model_name)
    params, seeded = WORKLOAD_PARAMS[case]
    runs: dict[DecodeForward, list[DecodeRequest]] = {}
    engines: dict[DecodeForward, DecodeEngine] = {}
    for forward in ("model", "lean"):
        torch.manual_seed(0)
        engines[forward] = _engine(model, params, forward)
        runs[forward] = mixed_workload(engines[forward], model[1], seeded=seeded)
    for old, new in zip(runs["model"], runs["lean"], strict=True):
        assert new.token_ids == old.token_ids
        assert new.logprobs == old.logprobs
        assert new.finish_reason == old.finish_reason
    stats = engines["lean"].stats
    assert (stats.decode_forward, engines["model"].stats.decode_forward) == ("lean", "model")
    assert attrs.evolve(stats, decode_forward="model") == engines["model"].stats
    assert stats.prefix_hits > 0
    assert stats.max_rows == 5
    assert len({len(r.token_ids) for r in runs["lean"]}) >= 4  # rows left at different steps


def _prefilled_pools(model: nn.Module, prompts: list[list[int]], pools: int) -> list[KVPool]:
    width = max(map(len, prompts))
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    cache = DynamicCache()
    model(
        input_ids=ids,
        attention_mask=mask,
        position_ids=(mask.cumsum(-1) - 1).clamp(min=0),
        past_key_values=cache,
        use_cache=True,
    )
    result = [KVPool(max_rows=8, device=torch.device("cpu")) for _ in range(pools)]
    for pool in result:
        pool.merge(cache, mask)
    return result


@pytest.mark.parametrize("model_name", ["qwen3_gqa", "llama_lora", "qwen3_bf16", "qwen2_bias"])
@pytest.mark.parametrize("ragged", [False, True], ids=["no mask", "padded rows"])
def test_each_decode_steps_logits_and_pool_columns_are_the_model_forwards(
    model_name: str, ragged: bool, request: pytest.FixtureRequest
) -> None:
    """Step by step, unpadded rows (no mask: SDPA's grouped-query path) and padded ones (a boolean mask:
    repeated KV heads); the keys and values written into the pool are the same too."""
    lm, tokenizer = request.getfixturevalue(model_name)
    prompts = [prompt_ids(tokenizer, i) for i in range(4)]
    if not ragged:  # the same length: their last tokens
        prompts = [p[-min(map(len, prompts)) :] for p in prompts]
    assert (len({len(p) for p in prompts}) > 1) == ragged

    def forward(**kwargs: Any) -> Any:
        return lm(**kwargs, use_cache=True, logits_to_keep=1)

    lean = LeanDecoder(lm)
    with torch.inference_mode():
        plain, fast = _prefilled_pools(lm, prompts, 2)
        start = torch.tensor([len(p) for p in prompts])
        positions = start
        first: list[torch.Tensor] = []
        for step in range(40):
            tokens = torch.arange(len(prompts)) + 17 + step
            expected = plain.step(forward, tokens, positions)
            assert torch.equal(fast.step(lean, tokens, positions), expected)
            first = first or [expected]
            positions = positions + 1
        for row in range(len(prompts)):
            for a, b in zip(fast.row_state(row), plain.row_state(row), strict=True):
                assert torch.equal(a.keys, b.keys)  # pyright: ignore[reportAttributeAccessIssue]
                assert torch.equal(a.values, b.values)  # pyright: ignore[reportAttributeAccessIssue]
        if isinstance(lm, PeftModel):
            with lm.disable_adapter():
                (base,) = _prefilled_pools(lm, prompts, 1)
                assert not torch.equal(base.step(forward, torch.arange(len(prompts)) + 17, start), first[0])


def test_the_lean_engine_never_calls_the_decoder_layers(tiny_8h: Model) -> None:
    engine = _engine(tiny_8h, SamplingParams(temperature=0.0), "auto", max_batch_size=4)
    assert engine.stats.decode_forward == "lean"
    calls = 0

    def count(*_: object) -> None:
        nonlocal calls
        calls += 1

    layers = [m for m in tiny_8h[0].modules() if isinstance(m, Qwen3DecoderLayer)]
    handles = [layer.register_forward_pre_hook(count) for layer in layers]
    try:
        requests = [DecodeRequest(prompt_ids=prompt_ids(tiny_8h[1], i), max_new_tokens=12) for i in range(4)]
        drain(engine, requests, waves=1)
    finally:
        for handle in handles:
            handle.remove()
    assert engine.stats.decode_calls >= 11
    assert calls == len(layers) * engine.stats.prefill_calls  # prefill only
    # A hook on a layer makes `auto` take the model's forward, which runs it.
    handle = layers[0].register_forward_pre_hook(count)
    try:
        assert _engine(tiny_8h, SamplingParams(), "auto").stats.decode_forward == "model"
        with pytest.raises(SamplerError, match="has hooks"):
            _engine(tiny_8h, SamplingParams(), "lean")
    finally:
        handle.remove()


def test_unsupported_models_take_the_model_forward_and_lean_names_why(
    tokenizer: PreTrainedTokenizerBase,
) -> None:
    hybrid = standin_model("qwen3.5", **_ids(tokenizer))
    sliding = Qwen2ForCausalLM(
        Qwen2Config(
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=2,
            num_key_value_heads=2,
            use_sliding_window=True,
            sliding_window=16,
            max_window_layers=0,
            **_ids(tokenizer),
        )
    )
    eager = standin_model("qwen3", **_ids(tokenizer))
    eager.config._attn_implementation = "eager"  # pyright: ignore[reportPrivateUsage]
    cases = {
        "Qwen3_5ForCausalLM (model_type 'qwen3_5_text') is not one of": hybrid,
        "sliding_attention": sliding,
        "attention implementation 'eager'": eager,
    }
    for reason, lm in cases.items():
        refused = lean_unsupported_reason(lm, "pool")
        assert refused is not None
        assert reason in refused
        if lm is sliding:  # the engine refuses sliding-window caches whatever the forward
            continue
        model = (lm.eval(), tokenizer)
        assert _engine(model, SamplingParams(), "auto").stats.decode_forward == "model"
        assert _engine(model, SamplingParams(), "model").stats.decode_forward == "model"
        with pytest.raises(SamplerError, match="decode_forward='lean' is not possible"):
            _engine(model, SamplingParams(), "lean")
    with pytest.raises(SamplerError, match="running cache is 'concat'"):
        _engine((hybrid, tokenizer), SamplingParams(), "lean")
    with pytest.raises(SamplerError, match="does not support this model"):
        LeanDecoder(eager)


def test_the_lean_forward_refuses_a_model_in_training_mode(qwen3_gqa: Model) -> None:
    lm, tokenizer = qwen3_gqa
    lean = LeanDecoder(lm)
    (pool,) = _prefilled_pools(lm, [prompt_ids(tokenizer, 0)], 1)
    lm.train()
    try:
        with pytest.raises(SamplerError, match="eval mode"):
            pool.step(lean, torch.tensor([5]), torch.tensor([3]))
    finally:
        lm.eval()


def test_the_pool_and_so_the_lean_forward_are_refused_for_eager_attention(
    tokenizer: PreTrainedTokenizerBase,
) -> None:
    """The pool hands attention SDPA's boolean mask: eager attention would add it to the scores, hiding nothing."""
    eager = standin_model("qwen3", **_ids(tokenizer)).eval()
    eager.config._attn_implementation = "eager"  # pyright: ignore[reportPrivateUsage]
    engine = _engine((eager, tokenizer), SamplingParams(), "auto")
    assert (engine.stats.kv_layout, engine.stats.decode_forward) == ("concat", "model")
    with pytest.raises(SamplerError, match="'eager' does not take"):
        DecodeEngine(
            eager,
            params=SamplingParams(),
            stop_token_ids=frozenset({1}),
            pad_token_id=0,
            max_batch_size=2,
            decode=str,
            kv_layout="pool",
        )


def test_the_hf_sampler_reports_its_decode_forward(tiny_dir: Path) -> None:
    policy = Policy.from_pretrained(tiny_dir, value_head=False)
    assert HFSampler(policy).metrics()["sampler/lean_forward"] == 1.0
    plain = HFSampler(policy, decode_forward="model")
    assert plain.metrics()["sampler/lean_forward"] == 0.0
    assert plain.engine.stats.decode_forward == "model"


def test_under_bf16_autocast_the_lean_step_is_the_model_forwards(llama_lora: Model) -> None:
    """``bf16-mixed`` sampling runs the engine under CPU autocast: the same submodules, the same casts."""
    lm, tokenizer = llama_lora
    prompts = [prompt_ids(tokenizer, i) for i in range(3)]

    def forward(**kwargs: Any) -> Any:
        return lm(**kwargs, use_cache=True, logits_to_keep=1)

    lean = LeanDecoder(lm)
    with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16):
        plain, fast = _prefilled_pools(lm, prompts, 2)
        positions = torch.tensor([len(p) for p in prompts])
        for step in range(10):
            tokens = torch.arange(len(prompts)) + 17 + step
            expected = plain.step(forward, tokens, positions)
            assert expected.dtype == torch.bfloat16
            assert torch.equal(fast.step(lean, tokens, positions), expected)
            positions = positions + 1
