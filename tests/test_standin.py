"""The stand-ins' tokenizers and models are those of the published Qwen and Llama 3 releases wherever the pipeline looks.

Expected values are the releases' own: ids from Qwen3-0.6B's, Qwen2.5-7B-Instruct's and Llama-3.1-8B-Instruct's
tokenizer_config.json ("added_tokens_decoder"), ``len(tokenizer)`` and the embedding size from their
config.json, the encoding of "Hello world" by the published tokenizer, and llama.cpp's tokenizer test vectors
(``ggml-vocab-*.gguf.inp/.out``: texts and the ids the vendor's own tokenizer gives them).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from e2e_testkit import StandinModel


def _test_vectors(directory: Path, vocab: str) -> list[tuple[str, list[int]]]:
    texts = (directory / f"{vocab}.inp").read_text().split("\n__ggml_vocab_test__\n")
    ids = (directory / f"{vocab}.out").read_text().split("\n")
    assert len(texts) == len(ids)
    assert texts[-1] == ids[-1] == ""
    return [(text, [int(i) for i in line.split()]) for text, line in zip(texts[:-1], ids[:-1], strict=True)]


@pytest.mark.parametrize("vocab", ["ggml-vocab-llama-bpe.gguf", "ggml-vocab-qwen2.gguf"])
def test_the_rebuilt_tokenizers_encode_llama_cpps_test_vectors_as_the_vendors_do(
    chat_templates_dir: Path, vocab: str
) -> None:
    pytest.importorskip("gguf")
    from mcprl_policy.standin import llama_tokenizer, qwen_tokenizer

    gguf_file = chat_templates_dir / vocab
    tokenizer = (
        llama_tokenizer(gguf_file, release="llama3.1", chat_template="")
        if "llama" in vocab
        else qwen_tokenizer(gguf_file, release="qwen3", chat_template="")
    )
    vectors = _test_vectors(chat_templates_dir, vocab)
    assert len(vectors) == 46
    got = [(text, tokenizer.encode(text, add_special_tokens=False)) for text, _ in vectors]
    assert got == vectors
    if "llama" in vocab:
        # Byte-level BPE without a normalizer decodes back to the text (Qwen normalizes to NFC first).
        assert all(tokenizer.decode(ids) == text for text, ids in vectors)


def test_llama_standin_has_the_published_ids_and_embedding(llama_standin_model: StandinModel) -> None:
    from transformers import AutoConfig, AutoTokenizer, GenerationConfig

    directory = llama_standin_model("llama3.1", "meta-llama-Llama-3.1-8B-Instruct.jinja")
    tokenizer = AutoTokenizer.from_pretrained(directory)
    assert len(tokenizer) == 128_256
    assert AutoConfig.from_pretrained(directory).vocab_size == 128_256
    assert tokenizer.encode("Hello world") == [128_000, 9906, 1917]
    ids = {"<|begin_of_text|>": 128_000, "<|end_of_text|>": 128_001, "<|finetune_right_pad_id|>": 128_004}
    ids |= {"<|start_header_id|>": 128_006, "<|end_header_id|>": 128_007, "<|eom_id|>": 128_008}
    ids |= {"<|eot_id|>": 128_009, "<|python_tag|>": 128_010, "<|reserved_special_token_0|>": 128_002}
    ids |= {"<|reserved_special_token_3|>": 128_011, "<|reserved_special_token_247|>": 128_255}
    assert {token: tokenizer.convert_tokens_to_ids(token) for token in ids} == ids
    assert (tokenizer.bos_token, tokenizer.eos_token, tokenizer.pad_token) == (
        "<|begin_of_text|>",
        "<|eot_id|>",
        None,
    )
    assert GenerationConfig.from_pretrained(directory).eos_token_id == [128_001, 128_008, 128_009]
    # Every special token is a control token: a sample decodes to its text alone.
    assert tokenizer.decode([128_010, 9906, 128_008, 128_009], skip_special_tokens=True) == "Hello"
    assert (directory / "chat_template.jinja").read_text() == tokenizer.chat_template


def test_hermes3_standin_ends_turns_with_chatml_im_end(llama_standin_model: StandinModel) -> None:
    from transformers import AutoTokenizer, GenerationConfig

    directory = llama_standin_model("hermes3", "NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja")
    tokenizer = AutoTokenizer.from_pretrained(directory)
    assert len(tokenizer) == 128_256
    assert tokenizer.eos_token == "<|im_end|>"
    assert tokenizer.eos_token_id == 128_040
    assert GenerationConfig.from_pretrained(directory).eos_token_id == [128_040]
    assert tokenizer.encode("<|im_start|>", add_special_tokens=False) == [128_039]


def test_the_policy_samples_only_decodable_ids_of_the_llama_standin(
    llama_standin_model: StandinModel,
) -> None:
    from mcprl_policy import Policy
    from mcprl_policy.vocab import embedding_rows

    policy = Policy.from_pretrained(
        llama_standin_model("llama3.1", "meta-llama-Llama-3.1-8B-Instruct.jinja"), value_head=False
    )
    assert policy.vocab_limit == embedding_rows(policy.model) == 128_256
    from mcprl_policy.vllm_sampler import allowed_token_ids

    assert allowed_token_ids(policy) is None


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
    from mcprl_policy.vllm_sampler import allowed_token_ids

    # vLLM's requests are bounded the same way (vllm itself is not needed to build the bound).
    assert allowed_token_ids(policy) == list(range(151_669))


def test_a_missing_vocabulary_file_names_the_script_that_fetches_it(tmp_path: Path) -> None:
    pytest.importorskip("gguf")
    from mcprl_policy import ModelLoadError
    from mcprl_policy.standin import qwen_tokenizer

    with pytest.raises(
        ModelLoadError, match=r"missing\.gguf does not exist: scripts/fetch-chat-templates\.py"
    ):
        qwen_tokenizer(tmp_path / "missing.gguf", release="qwen3", chat_template="")


def test_a_qwen_file_is_not_taken_for_the_llama_vocabulary(chat_templates_dir: Path) -> None:
    pytest.importorskip("gguf")
    from mcprl_policy import ModelLoadError
    from mcprl_policy.standin import llama_tokenizer

    with pytest.raises(ModelLoadError, match=r"is not the Llama 3 vocabulary \(151936 entries\)"):
        llama_tokenizer(chat_templates_dir / "ggml-vocab-qwen2.gguf", release="llama3.1", chat_template="")
