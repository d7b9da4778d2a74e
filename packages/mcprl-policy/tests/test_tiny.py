from __future__ import annotations

from pathlib import Path

from transformers import AutoModelForCausalLM, AutoTokenizer

from mcprl_policy import build_tiny_model
from mcprl_policy.tiny import SPECIAL_TOKENS

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_quote",
            "description": "Latest price of a stock.\nLonger text the tiny model never sees.",
            "parameters": {"type": "object", "properties": {"symbol": {"type": "string"}}},
        },
    },
    {"name": "calculate", "description": "Evaluate.", "parameters": {"properties": {"expression": {}}}},
]

CONVERSATION = [
    {"role": "system", "content": "Answer with tools."},
    {"role": "user", "content": "What is 3 times the price of ACME?"},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"type": "function", "function": {"name": "get_quote", "arguments": {"symbol": "ACME"}}}
        ],
    },
    {"role": "tool", "content": '{"symbol":"ACME","price":123.45}'},
    {"role": "assistant", "content": "<answer>370.35</answer>"},
]


def test_build_is_deterministic_byte_for_byte(tmp_path: Path) -> None:
    first = build_tiny_model("tiny", cache_dir=tmp_path / "a")
    second = build_tiny_model("tiny", cache_dir=tmp_path / "b")
    assert first.name == second.name
    names = sorted(p.name for p in first.iterdir())
    assert names == sorted(p.name for p in second.iterdir())
    assert "model.safetensors" in names
    for name in names:
        assert (first / name).read_bytes() == (second / name).read_bytes(), name


def test_second_build_reuses_the_cached_directory(tiny_dir: Path) -> None:
    stamp = (tiny_dir / "model.safetensors").stat().st_mtime_ns
    again = build_tiny_model("tiny", cache_dir=tiny_dir.parent)
    assert again == tiny_dir
    assert (again / "model.safetensors").stat().st_mtime_ns == stamp


def test_extra_corpus_changes_the_cache_key(tiny_dir: Path) -> None:
    other = build_tiny_model("tiny", extra_corpus=["an extra document"], cache_dir=tiny_dir.parent)
    assert other != tiny_dir


def test_tiny_model_loads_through_transformers(tiny_dir: Path) -> None:
    model = AutoModelForCausalLM.from_pretrained(tiny_dir)
    assert model.config.model_type == "qwen3"
    assert model.config.hidden_size == 128
    assert model.config.num_hidden_layers == 2
    assert 0.3e6 < sum(p.numel() for p in model.parameters()) < 2e6


def test_digits_are_one_token_each(tiny_dir: Path) -> None:
    tok = AutoTokenizer.from_pretrained(tiny_dir)
    pieces = tok.tokenize("price 1234.50")
    assert [p for p in pieces if any(c.isdigit() for c in p)] == ["1", "2", "3", "4", "5", "0"]


def test_special_and_markup_tokens_are_single_ids(tiny_dir: Path) -> None:
    tok = AutoTokenizer.from_pretrained(tiny_dir)
    for token in SPECIAL_TOKENS:
        assert len(tok.encode(token, add_special_tokens=False)) == 1, token
    assert tok.eos_token == "<|im_end|>"
    ids = tok.encode('<tool_call>{"a": 1}</tool_call><|im_end|>', add_special_tokens=False)
    assert tok.decode(ids, skip_special_tokens=True) == '<tool_call>{"a": 1}</tool_call>'


def test_chat_template_renders_tools_compactly_and_calls_hermes_style(tiny_dir: Path) -> None:
    tok = AutoTokenizer.from_pretrained(tiny_dir)
    text = tok.apply_chat_template(CONVERSATION, tools=TOOLS, tokenize=False)
    assert text.startswith(
        "<|im_start|>system\nAnswer with tools.\n\n# Tools\nget_quote(symbol)\ncalculate(expression)\n"
    )
    assert "Latest price" not in text
    assert '<tool_call>{"name": "get_quote", "arguments": {"symbol": "ACME"}}</tool_call><|im_end|>\n' in text
    assert (
        '<|im_start|>user\n<tool_response>\n{"symbol":"ACME","price":123.45}\n</tool_response><|im_end|>'
        in text
    )


def test_chat_template_is_prefix_stable(tiny_dir: Path) -> None:
    tok = AutoTokenizer.from_pretrained(tiny_dir)
    full = tok.apply_chat_template(CONVERSATION, tools=TOOLS, tokenize=False)
    for cut in (2, 4):
        prefix = tok.apply_chat_template(
            CONVERSATION[:cut], tools=TOOLS, tokenize=False, add_generation_prompt=True
        )
        assert full.startswith(prefix)
        assert full[len(prefix) :].startswith(
            '<tool_call>{"name"' if cut == 2 else "<answer>370.35</answer><|im_end|>"
        )


def test_chat_template_marks_assistant_tokens(tiny_dir: Path) -> None:
    tok = AutoTokenizer.from_pretrained(tiny_dir)
    out = tok.apply_chat_template(
        CONVERSATION, tools=TOOLS, tokenize=True, return_dict=True, return_assistant_tokens_mask=True
    )
    kept = [t for t, m in zip(out["input_ids"], out["assistant_masks"], strict=True) if m]
    assert tok.decode(kept) == (
        '<tool_call>{"name": "get_quote", "arguments": {"symbol": "ACME"}}</tool_call><|im_end|>'
        "<answer>370.35</answer><|im_end|>"
    )


def test_the_8_head_preset_differs_from_tiny_only_in_its_heads(tmp_path: Path) -> None:
    base = AutoModelForCausalLM.from_pretrained(build_tiny_model("tiny", cache_dir=tmp_path)).config
    eight = AutoModelForCausalLM.from_pretrained(build_tiny_model("tiny-8h", cache_dir=tmp_path)).config
    assert (eight.num_attention_heads, eight.num_key_value_heads, eight.head_dim) == (8, 8, 16)
    assert (base.num_attention_heads, base.num_key_value_heads, base.head_dim) == (4, 2, 32)
    same = ("hidden_size", "num_hidden_layers", "intermediate_size", "vocab_size", "tie_word_embeddings")
    assert all(getattr(eight, k) == getattr(base, k) for k in same)
