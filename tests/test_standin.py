"""The stand-in's tokenizer and model are those of the published Qwen releases wherever the pipeline looks.

Expected values are the releases' own: ids from Qwen3-0.6B's and Qwen2.5-7B-Instruct's tokenizer_config.json
("added_tokens_decoder"), ``len(tokenizer)`` and the embedding size from their config.json, and the encoding
of "Hello world" by the published tokenizer.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

StandinModel = Callable[[str, str], Path]


def test_qwen3_standin_has_the_published_ids_and_embedding(standin_model: StandinModel) -> None:
    from transformers import AutoConfig, AutoTokenizer

    directory = standin_model("qwen3", "Qwen-Qwen3-0.6B.jinja")
    tokenizer = AutoTokenizer.from_pretrained(directory)
    assert len(tokenizer) == 151_669
    assert AutoConfig.from_pretrained(directory).vocab_size == 151_936
    assert tokenizer.encode("Hello world") == [9707, 1879]
    ids = {"<|endoftext|>": 151_643, "<|im_start|>": 151_644, "<|im_end|>": 151_645, "<tool_call>": 151_657}
    ids |= {"</tool_call>": 151_658, "<tool_response>": 151_665, "<think>": 151_667, "</think>": 151_668}
    assert {token: tokenizer.convert_tokens_to_ids(token) for token in ids} == ids
    assert tokenizer.eos_token == "<|im_end|>"
    assert tokenizer.pad_token == "<|endoftext|>"
    # Control tokens are dropped when a sample is decoded; tool-call and thinking markup stays in the text.
    text = tokenizer.decode([151_667, 9707, 151_668, 151_657, 151_645], skip_special_tokens=True)
    assert text == "<think>Hello</think><tool_call>"
    assert (directory / "chat_template.jinja").read_text() == tokenizer.chat_template


def test_qwen25_standin_stops_at_the_releases_last_added_token(standin_model: StandinModel) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(standin_model("qwen2.5", "Qwen-Qwen2.5-7B-Instruct.jinja"))
    assert len(tokenizer) == 151_665
    assert tokenizer.convert_tokens_to_ids("<|file_sep|>") == 151_664
    assert tokenizer.encode("<think>") != [151_667]


def test_the_policy_samples_only_decodable_ids_of_the_standin(standin_model: StandinModel) -> None:
    from mcprl_policy import Policy

    policy = Policy.from_pretrained(standin_model("qwen3", "Qwen-Qwen3-0.6B.jinja"), value_head=False)
    assert policy.vocab_limit == 151_669
    from mcprl_policy.vocab import embedding_rows

    assert embedding_rows(policy.model) == 151_936


def test_a_missing_vocabulary_file_names_the_script_that_fetches_it(tmp_path: Path) -> None:
    pytest.importorskip("gguf")
    from mcprl_policy import ModelLoadError
    from mcprl_policy.standin import qwen_tokenizer

    with pytest.raises(
        ModelLoadError, match=r"missing\.gguf does not exist: scripts/fetch-chat-templates\.py"
    ):
        qwen_tokenizer(tmp_path / "missing.gguf", release="qwen3", chat_template="")
