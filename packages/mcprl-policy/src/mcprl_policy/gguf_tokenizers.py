"""The Qwen2/2.5/3 and Llama 3.x / Hermes 3 tokenizers, rebuilt from llama.cpp's gguf vocabularies.

The Qwen tokenizer is rebuilt from llama.cpp's ``ggml-vocab-qwen2.gguf`` (the byte-level BPE that Qwen2, Qwen2.5
and Qwen3 share; ``scripts/fetch-chat-templates.py`` caches it) with the added tokens each release puts after the
BPE ids (`QWEN_ADDED_TOKENS`), so ids, ``len(tokenizer)`` and the decoding of special tokens are those of the
published tokenizer. The Llama 3.x / Hermes 3 tokenizer is rebuilt the same way from llama.cpp's
``ggml-vocab-llama-bpe.gguf`` (`llama_tokenizer`). Reading a gguf needs the ``gguf`` package
(``pip install gguf``). The random-weight models that go with them are `mcprl_policy.standin`'s.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any, Final, Literal, assert_never

from transformers import AutoTokenizer, PreTrainedTokenizerFast

from mcprl_policy.errors import ModelLoadError

__all__ = [
    "LLAMA3_BPE_IDS",
    "LLAMA3_VOCAB_ROWS",
    "QWEN_ADDED_TOKENS",
    "QWEN_BPE_IDS",
    "QWEN_VOCAB_ROWS",
    "LlamaRelease",
    "QwenRelease",
    "llama_special_tokens",
    "llama_tokenizer",
    "qwen_tokenizer",
]

QwenRelease = Literal["qwen2.5", "qwen3"]
"""Which release's added tokens the tokenizer gets (both share the BPE ids and the embedding size)."""

QWEN_VOCAB_ROWS: Final = 151_936
"""Rows of the embedding of Qwen2.5-0.5B/1.5B/3B and every Qwen3 dense model up to 4B (a multiple of 128)."""

QWEN_BPE_IDS: Final = 151_643
"""Ids ``[0, 151643)`` are the byte-level BPE vocabulary; the added tokens follow."""

# (content, special) in id order from 151,643, as in the releases' tokenizer_config.json "added_tokens_decoder".
_QWEN25_ADDED: Final = (
    ("<|endoftext|>", True),
    ("<|im_start|>", True),
    ("<|im_end|>", True),
    ("<|object_ref_start|>", True),
    ("<|object_ref_end|>", True),
    ("<|box_start|>", True),
    ("<|box_end|>", True),
    ("<|quad_start|>", True),
    ("<|quad_end|>", True),
    ("<|vision_start|>", True),
    ("<|vision_end|>", True),
    ("<|vision_pad|>", True),
    ("<|image_pad|>", True),
    ("<|video_pad|>", True),
    ("<tool_call>", False),
    ("</tool_call>", False),
    ("<|fim_prefix|>", False),
    ("<|fim_middle|>", False),
    ("<|fim_suffix|>", False),
    ("<|fim_pad|>", False),
    ("<|repo_name|>", False),
    ("<|file_sep|>", False),
)
QWEN_ADDED_TOKENS: Final[dict[QwenRelease, tuple[tuple[str, bool], ...]]] = {
    "qwen2.5": _QWEN25_ADDED,
    "qwen3": (
        *_QWEN25_ADDED,
        ("<tool_response>", False),
        ("</tool_response>", False),
        ("<think>", False),
        ("</think>", False),
    ),
}
"""The tokens each release adds after the BPE ids (Qwen2.5: 22, ``len(tokenizer)`` 151,665; Qwen3: 26, 151,669)."""


def qwen_tokenizer(gguf_file: Path, *, release: QwenRelease, chat_template: str) -> PreTrainedTokenizerFast:
    """The ``release`` tokenizer rebuilt from llama.cpp's Qwen2 vocabulary, with ``chat_template``.

    Args:
        gguf_file: ``ggml-vocab-qwen2.gguf`` (BPE vocabulary and merges; its padding entries are dropped).
        release: Whose added tokens follow the BPE ids.
        chat_template: The chat template, as the vendor publishes it.

    Raises:
        ModelLoadError: ``gguf`` is not installed, the file does not exist or is not the Qwen2 vocabulary.
    """
    spec = _bpe_spec(gguf_file, "<|endoftext|>", QWEN_BPE_IDS, QWEN_VOCAB_ROWS, "Qwen2")
    spec["added_tokens"] = [
        {
            "id": QWEN_BPE_IDS + offset,
            "content": content,
            "single_word": False,
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
            "special": special,
        }
        for offset, (content, special) in enumerate(QWEN_ADDED_TOKENS[release])
    ]
    # As in the releases' tokenizer.json: NFC first, byte-level post-processing and decoding without a prefix.
    spec["normalizer"] = {"type": "NFC"}
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}
    spec["post_processor"] = byte_level
    spec["decoder"] = byte_level
    from tokenizers import Tokenizer

    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(json.dumps(spec)),
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        model_max_length=131_072,
    )
    tokenizer.chat_template = chat_template
    return tokenizer


def _require_gguf(gguf_file: Path) -> None:
    try:
        import gguf  # noqa: F401  # pyright: ignore[reportUnusedImport]
    except ImportError as exc:
        raise ModelLoadError(
            "reading a .gguf vocabulary needs the gguf package: pip install gguf (uv sync --group test)"
        ) from exc
    if not gguf_file.is_file():
        raise ModelLoadError(f"{gguf_file} does not exist: scripts/fetch-chat-templates.py caches it")


def _bpe_spec(gguf_file: Path, first_special: str, bpe_ids: int, rows: int, name: str) -> dict[str, Any]:
    """The gguf's tokenizer.json, checked to be ``name``'s vocabulary, with only the BPE ids ``[0, bpe_ids)``."""
    _require_gguf(gguf_file)
    spec = json.loads(_gguf_tokenizer_json(gguf_file.resolve()))
    vocab: dict[str, int] = spec["model"]["vocab"]
    if vocab.get(first_special) != bpe_ids or len(vocab) != rows:
        raise ModelLoadError(f"{gguf_file} is not the {name} vocabulary ({len(vocab)} entries)")
    spec["model"]["vocab"] = {token: i for token, i in vocab.items() if i < bpe_ids}
    return spec


@functools.cache
def _gguf_tokenizer_json(gguf_file: Path) -> str:
    # Parsing the gguf takes seconds; every release and template starts from the same BPE.
    base = AutoTokenizer.from_pretrained(str(gguf_file.parent), gguf_file=gguf_file.name)
    return base.backend_tokenizer.to_str()


LlamaRelease = Literal["llama3.1", "hermes3"]
"""Whose names the 256 special tokens get: Meta's Llama 3.1/3.2/3.3 Instruct, or Nous Research's Hermes 3."""

LLAMA3_VOCAB_ROWS: Final = 128_256
"""Rows of the embedding of every Llama 3.x model and of Hermes 3 (``config.json`` ``vocab_size``)."""

LLAMA3_BPE_IDS: Final = 128_000
"""Ids ``[0, 128000)`` are the byte-level BPE vocabulary; 256 special tokens follow."""

# Meta's names for ids 128000-128011 in Llama-3.1-8B-Instruct's tokenizer_config.json ("added_tokens_decoder");
# every other id up to 128255 is <|reserved_special_token_N|> with N = id - 128008.
_LLAMA31_NAMED: Final = {
    128_000: "<|begin_of_text|>",
    128_001: "<|end_of_text|>",
    128_002: "<|reserved_special_token_0|>",
    128_003: "<|reserved_special_token_1|>",
    128_004: "<|finetune_right_pad_id|>",
    128_005: "<|reserved_special_token_2|>",
    128_006: "<|start_header_id|>",
    128_007: "<|end_header_id|>",
    128_008: "<|eom_id|>",
    128_009: "<|eot_id|>",
    128_010: "<|python_tag|>",
}
# Hermes 3 (Llama 3.1 base) keeps the 128,256 rows and puts ChatML's markers in reserved slots: its config.json
# names 128040 as eos_token_id, its special_tokens_map.json <|im_end|> as eos_token. <|im_start|> at 128039 is
# assumed (Hermes 3's tokenizer_config.json was not available when this was written); the template writes it as
# one special token either way.
_HERMES3_CHATML: Final = {128_039: "<|im_start|>", 128_040: "<|im_end|>"}


def llama_special_tokens(release: LlamaRelease) -> list[str]:
    """The contents of ids 128000-128255, in id order, as ``release`` names them."""
    named = dict(_LLAMA31_NAMED)
    match release:
        case "llama3.1":
            pass
        case "hermes3":
            named |= _HERMES3_CHATML
        case _:
            assert_never(release)
    return [
        named.get(i, f"<|reserved_special_token_{i - 128_008}|>")
        for i in range(LLAMA3_BPE_IDS, LLAMA3_VOCAB_ROWS)
    ]


def llama_tokenizer(gguf_file: Path, *, release: LlamaRelease, chat_template: str) -> PreTrainedTokenizerFast:
    """The Llama 3.x (or Hermes 3) tokenizer rebuilt from llama.cpp's ``ggml-vocab-llama-bpe.gguf``.

    The gguf holds Meta's 128,000 BPE ids, the 280,147 merges and 256 special tokens under Llama 3's names;
    the pipeline around them is Llama 3's ``tokenizer.json``: no normalizer, the Llama 3 split regex, BPE with
    ``ignore_merges`` (a pre-token that is a whole vocabulary entry is that entry), ``<|begin_of_text|>``
    prepended when special tokens are added, byte-level decoding.

    Args:
        gguf_file: ``ggml-vocab-llama-bpe.gguf``.
        release: Whose special-token names and end-of-turn token the tokenizer gets.
        chat_template: The chat template, as the vendor publishes it.

    Raises:
        ModelLoadError: ``gguf`` is not installed, the file does not exist or is not the Llama 3 vocabulary.
    """
    spec = _bpe_spec(gguf_file, "<|begin_of_text|>", LLAMA3_BPE_IDS, LLAMA3_VOCAB_ROWS, "Llama 3")
    spec["model"]["ignore_merges"] = True
    spec["added_tokens"] = [
        {
            "id": LLAMA3_BPE_IDS + offset,
            "content": content,
            "single_word": False,
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
            "special": True,
        }
        for offset, content in enumerate(llama_special_tokens(release))
    ]
    spec["normalizer"] = None
    spec["post_processor"] = {
        "type": "Sequence",
        "processors": [
            {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True},
            {
                "type": "TemplateProcessing",
                "single": [
                    {"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 0}},
                    {"Sequence": {"id": "A", "type_id": 0}},
                ],
                "pair": [
                    {"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 0}},
                    {"Sequence": {"id": "A", "type_id": 0}},
                    {"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 1}},
                    {"Sequence": {"id": "B", "type_id": 1}},
                ],
                "special_tokens": {
                    "<|begin_of_text|>": {
                        "id": "<|begin_of_text|>",
                        "ids": [LLAMA3_BPE_IDS],
                        "tokens": ["<|begin_of_text|>"],
                    }
                },
            },
        ],
    }
    spec["decoder"] = {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True}
    from tokenizers import Tokenizer

    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(json.dumps(spec)),
        bos_token="<|begin_of_text|>",
        eos_token=_LLAMA_EOS[release],
        model_max_length=131_072,
        # Meta publishes True; transformers ignores it for BPE tokenizers (with a warning), so False decodes alike.
        clean_up_tokenization_spaces=False,
    )
    tokenizer.chat_template = chat_template
    return tokenizer


_LLAMA_EOS: Final[dict[LlamaRelease, str]] = {"llama3.1": "<|eot_id|>", "hermes3": "<|im_end|>"}
