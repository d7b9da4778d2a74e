"""The preallocated KV pool against the concatenating cache: the same workload gives the same bits.

Both layouts run through the same `DecodeEngine` code; only the running rows' cache differs. The models are
real: the embedded ``tiny-8h`` (the demo's Qwen3 shape: 8 heads and 8 KV heads of 16 dims, q_norm/k_norm)
and a seeded random-weight Qwen3 stand-in with grouped-query attention (4 heads over 2 KV heads), both with the
embedded tokenizer and its chat template. The workload mixes everything the engine does between steps: rows
joining a running batch and leaving it at different steps, slots reused, buffers growing (more rows, more
columns), next turns resuming cached prefixes, stop strings, repetition penalty, greedy, seeded and unseeded
sampling. Tokens, logprobs and finish reasons must be equal (logprobs bit for bit, not within a tolerance).
"""

from __future__ import annotations

import gc
import weakref
from pathlib import Path
from typing import Any

import attrs
import pytest
import torch
from decode_testkit import WORKLOAD_PARAMS, build_engine, mixed_workload, prompt_ids, tool_turn_ids
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    DynamicCache,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)
from transformers.cache_utils import DynamicLayer

from mcprl_policy import SamplerError, SamplingParams, attention, build_tiny_model
from mcprl_policy.batch_cache import ConcatCache
from mcprl_policy.cache_rows import AttentionRow
from mcprl_policy.decode import DecodeEngine, DecodeRequest
from mcprl_policy.kv_pool import KVPool, PoolLayer
from mcprl_policy.standin import standin_model

Model = tuple[PreTrainedModel, PreTrainedTokenizerBase]


@pytest.fixture(scope="module")
def tiny_8h(tmp_path_factory: pytest.TempPathFactory) -> Model:
    directory = build_tiny_model("tiny-8h", cache_dir=tmp_path_factory.mktemp("models"))
    return AutoModelForCausalLM.from_pretrained(directory), AutoTokenizer.from_pretrained(directory)


@pytest.fixture(scope="module")
def qwen3_gqa(tiny_dir: Path) -> Model:
    tokenizer = AutoTokenizer.from_pretrained(tiny_dir)
    model = standin_model(
        "qwen3",
        vocab_size=len(tokenizer),
        eos_token_id=int(tokenizer.convert_tokens_to_ids("<|im_end|>")),
        pad_token_id=int(tokenizer.pad_token_id),
        initializer_range=0.2,
    )
    assert model.config.num_key_value_heads < model.config.num_attention_heads
    return model.eval(), tokenizer


@pytest.mark.parametrize(
    ("model_name", "case"),
    [("tiny_8h", case) for case in WORKLOAD_PARAMS] + [("qwen3_gqa", "sampled, penalty, stop string")],
)
def test_the_pool_gives_the_concatenating_caches_tokens_and_logprobs_bit_for_bit(
    model_name: str, case: str, request: pytest.FixtureRequest
) -> None:
    model: Model = request.getfixturevalue(model_name)
    params, seeded = WORKLOAD_PARAMS[case]
    runs: dict[str, list[DecodeRequest]] = {}
    engines: dict[str, DecodeEngine] = {}
    for layout in ("concat", "pool"):
        torch.manual_seed(0)
        engines[layout] = build_engine(*model, params=params, max_batch_size=5, kv_layout=layout)
        runs[layout] = mixed_workload(engines[layout], model[1], seeded=seeded)
    for old, new in zip(runs["concat"], runs["pool"], strict=True):
        assert new.token_ids == old.token_ids
        assert new.logprobs == old.logprobs
        assert new.finish_reason == old.finish_reason
    stats = engines["pool"].stats
    assert attrs.evolve(stats, kv_layout="concat") == engines["concat"].stats
    # The workload's shared prompts took one prefill each, and every prompt token is counted once.
    assert stats.shared_rows == 4
    assert stats.prefill_tokens + stats.prefix_tokens + stats.shared_tokens == sum(
        len(r.prompt_ids) for r in runs["pool"]
    )
    assert (stats.kv_layout, engines["concat"].stats.kv_layout) == ("pool", "concat")
    assert stats.prefix_hits > 0
    assert stats.max_rows == 5
    reasons = {r.finish_reason for r in runs["pool"]}
    assert reasons == {"stop", "length"} or not params.stop
    assert len({len(r.token_ids) for r in runs["pool"]}) >= 4  # rows left at different steps


def test_decode_attention_row_by_row_keeps_pool_and_concat_bit_for_bit(
    qwen3_gqa: Model, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the CPU decode kernel (`mcprl_policy.attention.decode_sdpa`, the varlen implementation's) attending
    row by row on every masked window (its thresholds lowered to this workload's short rows), both layouts still
    give the same bits: a row's attention depends on its own columns alone."""
    model, tokenizer = qwen3_gqa
    model.config._attn_implementation = attention.VARLEN_SDPA  # pyright: ignore[reportPrivateUsage]
    monkeypatch.setattr(attention, "PER_ROW_MIN_WINDOW", 4)
    monkeypatch.setattr(attention, "PER_ROW_MIN_MASKED", 1)
    split: list[int] = []
    row_windows = attention.row_windows

    def counted(mask: torch.Tensor | None, rows: int) -> list[tuple[int, bool]] | None:
        windows = row_windows(mask, rows)
        split.append(windows is not None)
        return windows

    monkeypatch.setattr(attention, "row_windows", counted)
    params, seeded = WORKLOAD_PARAMS["sampled, penalty, stop string"]
    runs: dict[str, list[DecodeRequest]] = {}
    try:
        for layout in ("concat", "pool"):
            torch.manual_seed(0)
            engine = build_engine(model, tokenizer, params=params, max_batch_size=5, kv_layout=layout)
            runs[layout] = mixed_workload(engine, tokenizer, seeded=seeded)
    finally:
        model.config._attn_implementation = "sdpa"  # pyright: ignore[reportPrivateUsage]
    assert sum(split) >= 20  # the row-by-row path ran (on the masked windows: the others have no mask)
    for old, new in zip(runs["concat"], runs["pool"], strict=True):
        assert (new.token_ids, new.logprobs, new.finish_reason) == (
            old.token_ids,
            old.logprobs,
            old.finish_reason,
        )


def test_a_decode_step_writes_into_the_pool_in_place_and_never_concatenates(
    tiny_8h: Model, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = build_engine(
        *tiny_8h, params=SamplingParams(temperature=0.0), max_batch_size=8, kv_layout="pool"
    )
    requests = [DecodeRequest(prompt_ids=prompt_ids(tiny_8h[1], i), max_new_tokens=30) for i in range(4)]
    with torch.inference_mode():
        engine._admit(requests, engine.device)  # pyright: ignore[reportPrivateUsage]
    pool = engine._cache  # pyright: ignore[reportPrivateUsage]
    assert isinstance(pool, KVPool)
    buffers = [t.data_ptr() for t in (*pool._keys, *pool._values)]  # pyright: ignore[reportPrivateUsage]
    updates = 0
    original = DynamicLayer.update

    def counting(self: DynamicLayer, *args: Any, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        nonlocal updates
        updates += 1
        return original(self, *args, **kwargs)

    monkeypatch.setattr(DynamicLayer, "update", counting)
    end = pool.end
    with torch.inference_mode():
        for _ in range(10):
            assert not engine._decode_step(engine.device)  # pyright: ignore[reportPrivateUsage]
    assert pool.end == end + 10
    assert updates == 0
    assert [t.data_ptr() for t in (*pool._keys, *pool._values)] == buffers  # pyright: ignore[reportPrivateUsage]


def test_rows_leaving_and_joining_keep_every_rows_keys(tiny_8h: Model) -> None:
    """Through drops (slots refilled from the tail) and merges (slots and columns growing), every step's logits
    and each engine row's unmasked keys and values are those of the concatenated cache."""
    ops: list[tuple[str, Any]] = [
        ("merge", range(0, 3)),
        ("steps", 70),
        ("drop", [0, 2]),
        ("merge", range(3, 10)),
        ("steps", 5),
        ("drop", [0, 2, 5, 6, 8]),
        ("merge", range(10, 13)),
        ("steps", 5),
        ("drop", [1, 4, 5, 7]),
        ("steps", 3),
    ]
    _, columns, _ = _pool_against_concat(tiny_8h, ops)
    assert len(set(columns)) > 1  # the columns grew while rows ran


def test_rows_before_a_leaving_row_move_up_when_they_are_fewer(tiny_8h: Model) -> None:
    """A row leaving near the front moves the rows before it up (the running rows start past slot 0); a merge
    that would run past the last slot first moves the running rows down to slot 0, in the same buffers. Every
    step's logits and every row's keys and values stay those of the concatenated cache."""
    ops: list[tuple[str, Any]] = [
        ("merge", range(0, 8)),
        ("steps", 3),
        ("drop", list(range(1, 8))),  # the first row leaves: nothing moves
        ("steps", 2),
        ("drop", [0, *range(2, 7)]),  # the second of seven: the first moves up one
        ("steps", 2),
        ("drop", [0, 1, 2, 3, 5]),  # the fifth of six: the last moves down one
        ("steps", 2),
        ("merge", range(8, 11)),  # 5 running from slot 2, 3 joining: past the 8 slots
        ("steps", 4),
        ("drop", [0, 2, 3, 4, 5, 6, 7]),
        ("steps", 2),
    ]
    _, _, trace = _pool_against_concat(tiny_8h, ops)
    slots = [lo for lo, _, _ in trace]
    assert slots == [0, 0, 1, 1, 2, 2, 2, 2, 0, 0, 1, 1]
    assert len({buffers for _, _, buffers in trace[:-2]}) == 1  # no reallocation on the way to slot 0
    assert [moves for _, moves, _ in trace] == [0, 0, 0, 0, 1, 1, 2, 2, 7, 7, 8, 8]


def _pool_against_concat(
    model: Model, ops: list[tuple[str, Any]], max_rows: int = 16
) -> tuple[KVPool, list[int], list[tuple[int, int, int]]]:
    """Run ``ops`` on a pool and a concatenated cache side by side, checking logits and rows after each op.

    Returns the pool, its column count at every step, and per op the first running row's slot, the rows
    moved so far and the first key buffer's address.
    """
    lm, tokenizer = model
    pool, concat = KVPool(max_rows=max_rows, device=torch.device("cpu")), ConcatCache(torch.device("cpu"))
    moves = 0
    move = pool._move  # pyright: ignore[reportPrivateUsage]

    def counted_move(sources: list[int], to: int) -> None:
        nonlocal moves
        moves += len(sources)
        move(sources, to)

    pool._move = counted_move  # pyright: ignore[reportPrivateUsage]
    trace: list[tuple[int, int, int]] = []

    def forward(**kwargs: Any) -> Any:
        return lm(**kwargs, use_cache=True, logits_to_keep=1)

    def prefill(indices: range) -> tuple[DynamicCache, torch.Tensor]:
        prompts = [prompt_ids(tokenizer, i) + tool_turn_ids(tokenizer, i) * (i % 3) for i in indices]
        width = max(map(len, prompts))
        ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
        cache = DynamicCache()
        forward(
            input_ids=ids,
            attention_mask=mask,
            position_ids=(mask.cumsum(-1) - 1).clamp(min=0),
            past_key_values=cache,
        )
        return cache, mask

    positions = torch.zeros(0, dtype=torch.long)
    columns: list[int] = []
    with torch.inference_mode():
        for op, arg in ops:
            match op:
                case "merge":
                    cache, mask = prefill(arg)
                    concat.merge(_copy(cache), mask)
                    pool.merge(cache, mask)
                    positions = torch.cat([positions, mask.sum(-1)])
                case "drop":
                    pool.drop(arg)
                    concat.drop(arg)
                    positions = positions[arg]
                case _:
                    for step in range(arg):
                        tokens = torch.full((pool.rows,), 17 + step)
                        assert torch.equal(
                            pool.step(forward, tokens, positions), concat.step(forward, tokens, positions)
                        )
                        positions = positions + 1
                        columns.append(pool._mask.shape[1])  # pyright: ignore[reportPrivateUsage]
            assert pool.rows == concat.rows
            for row in range(pool.rows):
                for a, b in zip(pool.row_state(row), concat.row_state(row), strict=True):
                    assert isinstance(a, AttentionRow)
                    assert isinstance(b, AttentionRow)
                    assert torch.equal(a.keys, b.keys)
                    assert torch.equal(a.values, b.values)
            trace.append((pool.lo, moves, pool._keys[0].data_ptr()))  # pyright: ignore[reportPrivateUsage]
    return pool, columns, trace


def _copy(cache: DynamicCache) -> DynamicCache:
    copy = DynamicCache()
    for index, layer in enumerate(cache.layers):
        assert isinstance(layer, DynamicLayer)
        assert layer.keys is not None
        assert layer.values is not None
        copy.update(layer.keys.clone(), layer.values.clone(), index)
    return copy


def test_the_pool_is_refused_for_a_model_with_linear_attention(tiny_dir: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(tiny_dir)
    hybrid = standin_model(
        "qwen3.5",
        vocab_size=len(tokenizer),
        eos_token_id=int(tokenizer.convert_tokens_to_ids("<|im_end|>")),
        pad_token_id=int(tokenizer.pad_token_id),
    )
    with pytest.raises(SamplerError, match="linear-attention"):
        build_engine(hybrid, tokenizer, params=SamplingParams(), max_batch_size=5, kv_layout="pool")
    engine = build_engine(hybrid, tokenizer, params=SamplingParams(), max_batch_size=5)
    assert engine.stats.kv_layout == "concat"


def test_a_replaced_pool_frees_its_buffers_without_the_cyclic_collector(tiny_8h: Model) -> None:
    """Reference counting alone frees a pool the engine let go of: no cycle through its layers keeps it (or
    its buffers) alive until a full collection. The layers it handed out then refuse to be used."""
    engine = build_engine(
        *tiny_8h, params=SamplingParams(temperature=0.0), max_batch_size=8, kv_layout="pool"
    )
    requests = [DecodeRequest(prompt_ids=prompt_ids(tiny_8h[1], i), max_new_tokens=30) for i in range(4)]
    gc.collect()
    gc.disable()
    try:
        with torch.inference_mode():
            engine._admit(requests, engine.device)  # pyright: ignore[reportPrivateUsage]
            assert not engine._decode_step(engine.device)  # pyright: ignore[reportPrivateUsage]
        pool = engine._cache  # pyright: ignore[reportPrivateUsage]
        assert isinstance(pool, KVPool)
        layer = pool._cache.layers[0]  # pyright: ignore[reportPrivateUsage]
        assert isinstance(layer, PoolLayer)
        released = weakref.ref(pool)
        buffer = weakref.ref(pool._keys[0])  # pyright: ignore[reportPrivateUsage]
        del pool
        engine._reset()  # pyright: ignore[reportPrivateUsage]
        assert released() is None
        assert buffer() is None
    finally:
        gc.enable()
    with pytest.raises(SamplerError, match="after its pool was released"):
        layer.update(torch.zeros(1, 8, 1, 16), torch.zeros(1, 8, 1, 16))
