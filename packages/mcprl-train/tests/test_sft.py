"""Rendering demonstrations for the warm start: which tokens are targets."""

from __future__ import annotations

from pathlib import Path

import pytest
from transformers import AutoTokenizer

from mcprl_env import ChatTokenizer
from mcprl_policy.tiny import build_tiny_model
from mcprl_train.loop.warm_start import SFTExample, render_example

CALL = '<tool_call>{"name": "get_quote", "arguments": {"symbol": "ACME"}}</tool_call>'


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> ChatTokenizer:
    # transformers leaves AutoTokenizer.from_pretrained's parameters and return type unannotated.
    return AutoTokenizer.from_pretrained(  # pyright: ignore[reportUnknownMemberType, reportUnknownVariableType]
        build_tiny_model("tiny", cache_dir=Path(tmp_path_factory.mktemp("m")))
    )


def _conversation(first_weight: int | None) -> list[dict[str, object]]:
    first: dict[str, object] = {"role": "assistant", "content": CALL.replace("ACME", "ACNE")}
    if first_weight is not None:
        first["weight"] = first_weight
    return [
        {"role": "user", "content": "Price of ACME?"},
        first,
        {"role": "tool", "content": "Error executing tool get_quote: Unknown symbol 'ACNE'."},
        {"role": "assistant", "content": CALL},
        {"role": "tool", "content": '{"symbol":"ACME","price":12.5}'},
        {"role": "assistant", "content": "<answer>12.5</answer>"},
    ]


def _targets(tokenizer: ChatTokenizer, example: SFTExample) -> str:
    ids = [t for t, m in zip(example.token_ids, example.assistant_mask, strict=True) if m]
    return tokenizer.decode(ids)


def test_a_weight_0_message_stays_in_context_but_is_not_a_target(tokenizer: ChatTokenizer) -> None:
    full = render_example(tokenizer, _conversation(None), None)
    masked = render_example(tokenizer, _conversation(0), None)
    assert masked.token_ids == full.token_ids  # same context
    assert "ACNE" in _targets(tokenizer, full)
    assert "ACNE" not in _targets(tokenizer, masked)
    assert "ACME" in _targets(tokenizer, masked)
    assert "12.5" in _targets(tokenizer, masked)
    assert sum(masked.assistant_mask) < sum(full.assistant_mask)
    assert render_example(tokenizer, _conversation(1), None) == full


@pytest.mark.parametrize("weight", [2, 0.5, True, "0"])
def test_a_weight_other_than_0_or_1_is_refused(tokenizer: ChatTokenizer, weight: object) -> None:
    messages = _conversation(None)
    messages[1]["weight"] = weight
    with pytest.raises(ValueError, match="weight must be 0 or 1"):
        render_example(tokenizer, messages, None)


def test_a_demonstration_whose_every_assistant_message_has_weight_0_is_refused(
    tokenizer: ChatTokenizer,
) -> None:
    messages = [{**m, "weight": 0} if m["role"] == "assistant" else m for m in _conversation(None)]
    with pytest.raises(ValueError, match="no assistant tokens"):
        render_example(tokenizer, messages, None)
