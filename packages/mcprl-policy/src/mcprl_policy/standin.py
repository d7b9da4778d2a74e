"""A stand-in for a published Qwen chat model: random weights, the real vocabulary, the real chat template.

What a user brings (``Qwen/Qwen3-0.6B``) differs from the embedded tiny model in everything the pipeline
touches outside the weights: a 151,936-row embedding, a tokenizer that decodes fewer ids than that, special
tokens at the vendor's ids, and the vendor's chat template. A stand-in keeps all of those and shrinks only the
transformer (two layers, hidden size 64), so a whole ``mcprl-train`` run fits a CPU test. The ``qwen3.5``
architecture is Qwen3.5's hybrid decoder (``Qwen3_5ForCausalLM``: gated-delta-net linear-attention layers
interleaved with gated full-attention layers) on the same vocabulary: Qwen3.5's own 248k vocabulary is not
available offline, and the Qwen2/Qwen3 one holds every token its chat template writes.

The tokenizer is rebuilt from llama.cpp's ``ggml-vocab-qwen2.gguf`` (the byte-level BPE that Qwen2, Qwen2.5 and
Qwen3 share; ``scripts/fetch-chat-templates.py`` caches it) with the added tokens each release puts after the
BPE ids (`QWEN_ADDED_TOKENS`), so ids, ``len(tokenizer)`` and the decoding of special tokens are those of the
published tokenizer. Reading the gguf needs the ``gguf`` package (``pip install gguf``).
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Final, Literal, assert_never

import torch
from transformers import (
    AutoTokenizer,
    PretrainedConfig,
    PreTrainedModel,
    PreTrainedTokenizerFast,
    Qwen3_5ForCausalLM,
    Qwen3_5TextConfig,
    Qwen3Config,
    Qwen3ForCausalLM,
)

from mcprl_policy.errors import ModelLoadError

__all__ = [
    "QWEN_ADDED_TOKENS",
    "QWEN_VOCAB_ROWS",
    "QwenRelease",
    "StandinArchitecture",
    "qwen_tokenizer",
    "save_standin_model",
    "standin_model",
]

StandinArchitecture = Literal["qwen3", "qwen3.5"]
"""``qwen3``: ``Qwen3ForCausalLM``; ``qwen3.5``: the hybrid ``Qwen3_5ForCausalLM`` (linear + full attention)."""

QwenRelease = Literal["qwen2.5", "qwen3"]
"""Which release's added tokens the tokenizer gets (both share the BPE ids and the embedding size)."""

QWEN_VOCAB_ROWS: Final = 151_936
"""Rows of the embedding of Qwen2.5-0.5B/1.5B/3B and every Qwen3 dense model up to 4B (a multiple of 128)."""

_BPE_IDS: Final = 151_643
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
    try:
        import gguf  # noqa: F401  # pyright: ignore[reportUnusedImport]
    except ImportError as exc:
        raise ModelLoadError(
            "reading a .gguf vocabulary needs the gguf package: pip install gguf (uv sync --group test)"
        ) from exc
    if not gguf_file.is_file():
        raise ModelLoadError(f"{gguf_file} does not exist: scripts/fetch-chat-templates.py caches it")
    spec = json.loads(_gguf_tokenizer_json(gguf_file.resolve()))
    vocab: dict[str, int] = spec["model"]["vocab"]
    if vocab.get("<|endoftext|>") != _BPE_IDS or len(vocab) != QWEN_VOCAB_ROWS:
        raise ModelLoadError(f"{gguf_file} is not the Qwen2 vocabulary ({len(vocab)} entries)")
    spec["model"]["vocab"] = {token: i for token, i in vocab.items() if i < _BPE_IDS}
    spec["added_tokens"] = [
        {
            "id": _BPE_IDS + offset,
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


@functools.cache
def _gguf_tokenizer_json(gguf_file: Path) -> str:
    # Parsing the gguf takes seconds; every release and template starts from the same BPE.
    base = AutoTokenizer.from_pretrained(str(gguf_file.parent), gguf_file=gguf_file.name)
    return base.backend_tokenizer.to_str()


def save_standin_model(
    directory: Path,
    tokenizer: PreTrainedTokenizerFast,
    *,
    architecture: StandinArchitecture = "qwen3",
    hidden_size: int = 64,
    num_hidden_layers: int | None = None,
    seed: int = 0,
) -> Path:
    """Save a random-weight ``architecture`` model with ``QWEN_VOCAB_ROWS`` rows and ``tokenizer`` to ``directory``.

    The layout is a hub checkpoint's (``config.json``, ``model.safetensors``, ``generation_config.json``,
    the tokenizer files with the chat template), so anything that takes ``model.name`` loads it.
    """
    model = standin_model(
        architecture,
        vocab_size=QWEN_VOCAB_ROWS,
        eos_token_id=_BPE_IDS + 2,  # <|im_end|>
        pad_token_id=_BPE_IDS,  # <|endoftext|>
        hidden_size=hidden_size,
        num_hidden_layers=num_hidden_layers,
        seed=seed,
    )
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def standin_model(
    architecture: StandinArchitecture,
    *,
    vocab_size: int,
    eos_token_id: int,
    pad_token_id: int,
    hidden_size: int = 64,
    num_hidden_layers: int | None = None,
    seed: int = 0,
    initializer_range: float = 0.02,
) -> PreTrainedModel:
    """A seeded random-weight ``architecture`` causal LM, shrunk to ``hidden_size`` (four attention heads).

    ``qwen3.5`` alternates linear- and full-attention layers (``[linear, full] * (layers // 2)``; Qwen3.5
    itself puts one full-attention layer after every three linear ones), four layers unless told; ``qwen3``
    has two. A larger ``initializer_range`` than the released 0.02 spreads a random model's logits, so that its
    greedy choices are not near-ties.
    """
    heads = 4
    config: PretrainedConfig
    match architecture:
        case "qwen3":
            config = Qwen3Config(
                vocab_size=vocab_size,
                hidden_size=hidden_size,
                intermediate_size=2 * hidden_size,
                num_hidden_layers=num_hidden_layers or 2,
                num_attention_heads=heads,
                num_key_value_heads=2,
                head_dim=hidden_size // heads,
                max_position_embeddings=40_960,
                tie_word_embeddings=True,
                initializer_range=initializer_range,
                bos_token_id=None,
                eos_token_id=eos_token_id,
                pad_token_id=pad_token_id,
            )
            torch.manual_seed(seed)
            return Qwen3ForCausalLM(config)
        case "qwen3.5":
            layers = num_hidden_layers or 4
            if layers < 2:
                raise ValueError(
                    f"a qwen3.5 stand-in needs >= 2 layers (linear + full attention), got {layers}"
                )
            config = Qwen3_5TextConfig(
                vocab_size=vocab_size,
                hidden_size=hidden_size,
                intermediate_size=2 * hidden_size,
                num_hidden_layers=layers,
                num_attention_heads=heads,
                num_key_value_heads=2,
                head_dim=hidden_size // heads,
                linear_num_key_heads=2,
                linear_num_value_heads=heads,
                linear_key_head_dim=hidden_size // heads,
                linear_value_head_dim=hidden_size // heads,
                layer_types=["linear_attention" if i % 2 == 0 else "full_attention" for i in range(layers)],
                max_position_embeddings=40_960,
                tie_word_embeddings=True,
                initializer_range=initializer_range,
                bos_token_id=None,
                eos_token_id=eos_token_id,
                pad_token_id=pad_token_id,
            )
            torch.manual_seed(seed)
            return Qwen3_5ForCausalLM(config)
        case unreachable:
            assert_never(unreachable)
