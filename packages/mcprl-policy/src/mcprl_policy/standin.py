"""Stand-ins for published Qwen and Llama 3 chat models: random weights, the real vocabulary, the real template.

What a user brings (``Qwen/Qwen3-0.6B``) differs from the embedded tiny model in everything the pipeline
touches outside the weights: a 151,936-row embedding, a tokenizer that decodes fewer ids than that, special
tokens at the vendor's ids, and the vendor's chat template. A stand-in keeps all of those and shrinks only the
transformer (two layers, hidden size 64), so a whole ``mcprl-train`` run fits a CPU test. The ``qwen3.5``
architecture is Qwen3.5's hybrid decoder (``Qwen3_5ForCausalLM``: gated-delta-net linear-attention layers
interleaved with gated full-attention layers), on the Qwen2/Qwen3 vocabulary (which holds every token Qwen3.5's
template writes) or on Qwen3.5's own 248k vocabulary (`qwen35_tokenizer`, ``vocabulary="qwen3.5"``).

The tokenizers (`qwen_tokenizer`, `llama_tokenizer`, `qwen35_tokenizer`) are `mcprl_policy.gguf_tokenizers`' and
`mcprl_policy.tiktoken_tokenizers`' and re-exported here; this module builds the random-weight models that go
with them: a ``Qwen3ForCausalLM`` or ``Qwen3_5ForCausalLM`` of `QWEN_VOCAB_ROWS` or `QWEN35_VOCAB_ROWS` rows
(`save_standin_model`), a ``LlamaForCausalLM`` of `LLAMA3_VOCAB_ROWS` rows
(`save_llama_standin_model`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Final, Literal, assert_never

import torch
from transformers import (
    GenerationConfig,
    LlamaConfig,
    LlamaForCausalLM,
    PretrainedConfig,
    PreTrainedModel,
    PreTrainedTokenizerFast,
    Qwen3_5ForCausalLM,
    Qwen3_5TextConfig,
    Qwen3Config,
    Qwen3ForCausalLM,
)

from mcprl_policy.gguf_tokenizers import (
    LLAMA3_BPE_IDS,
    LLAMA3_VOCAB_ROWS,
    QWEN_ADDED_TOKENS,
    QWEN_BPE_IDS,
    QWEN_VOCAB_ROWS,
    LlamaRelease,
    QwenRelease,
    llama_special_tokens,
    llama_tokenizer,
    qwen_tokenizer,
)
from mcprl_policy.tiktoken_tokenizers import QWEN35_BPE_IDS, QWEN35_VOCAB_ROWS, qwen35_tokenizer

__all__ = [
    "LLAMA3_VOCAB_ROWS",
    "QWEN35_VOCAB_ROWS",
    "QWEN_ADDED_TOKENS",
    "QWEN_VOCAB_ROWS",
    "LlamaRelease",
    "QwenRelease",
    "QwenVocabulary",
    "StandinArchitecture",
    "llama_special_tokens",
    "llama_tokenizer",
    "qwen35_tokenizer",
    "qwen_tokenizer",
    "save_llama_standin_model",
    "save_standin_model",
    "standin_model",
]

StandinArchitecture = Literal["qwen3", "qwen3.5"]
"""``qwen3``: ``Qwen3ForCausalLM``; ``qwen3.5``: the hybrid ``Qwen3_5ForCausalLM`` (linear + full attention)."""

QwenVocabulary = Literal["qwen2", "qwen3.5"]
"""``qwen2``: the Qwen2/2.5/3 BPE (`qwen_tokenizer`); ``qwen3.5``: Qwen3.5's own (`qwen35_tokenizer`)."""


def save_standin_model(
    directory: Path,
    tokenizer: PreTrainedTokenizerFast,
    *,
    architecture: StandinArchitecture = "qwen3",
    vocabulary: QwenVocabulary = "qwen2",
    hidden_size: int = 64,
    num_hidden_layers: int | None = None,
    seed: int = 0,
) -> Path:
    """Save a random-weight ``architecture`` model with ``vocabulary``'s embedding rows and ``tokenizer``.

    ``vocabulary`` sets the rows (`QWEN_VOCAB_ROWS` or `QWEN35_VOCAB_ROWS`) and the end-of-turn and padding ids,
    which must be ``tokenizer``'s. The layout is a hub checkpoint's (``config.json``, ``model.safetensors``,
    ``generation_config.json``, the tokenizer files with the chat template), so anything that takes
    ``model.name`` loads it.

    Raises:
        ValueError: ``tokenizer`` is not ``vocabulary``'s (its ``<|im_end|>`` is elsewhere).
    """
    match vocabulary:
        case "qwen2":
            rows, first_added = QWEN_VOCAB_ROWS, QWEN_BPE_IDS
        case "qwen3.5":
            rows, first_added = QWEN35_VOCAB_ROWS, QWEN35_BPE_IDS
        case unreachable:
            assert_never(unreachable)
    eos, pad = first_added + 2, first_added  # <|im_end|>, <|endoftext|>
    if tokenizer.convert_tokens_to_ids("<|im_end|>") != eos:
        raise ValueError(
            f"the tokenizer is not the {vocabulary} vocabulary: <|im_end|> is "
            f"{tokenizer.convert_tokens_to_ids('<|im_end|>')}, expected {eos}"
        )
    model = standin_model(
        architecture,
        vocab_size=rows,
        eos_token_id=eos,
        pad_token_id=pad,
        hidden_size=hidden_size,
        num_hidden_layers=num_hidden_layers,
        seed=seed,
    )
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


# generation_config.json "eos_token_id" of Llama-3.1-8B-Instruct and of Hermes-3-Llama-3.1-8B.
_LLAMA_GENERATION_EOS: Final[dict[LlamaRelease, list[int]]] = {
    "llama3.1": [128_001, 128_008, 128_009],
    "hermes3": [128_040],
}


def save_llama_standin_model(
    directory: Path,
    tokenizer: PreTrainedTokenizerFast,
    *,
    release: LlamaRelease,
    hidden_size: int = 64,
    num_hidden_layers: int = 2,
    seed: int = 0,
) -> Path:
    """Save a random-weight ``LlamaForCausalLM`` with ``LLAMA3_VOCAB_ROWS`` rows and ``tokenizer`` to ``directory``.

    The architecture is Llama 3.2 1B's shrunk (tied embeddings, grouped-query attention, RoPE base 500,000);
    ``generation_config.json`` carries the release's end-of-turn ids, as the published checkpoint's does.
    """
    config = LlamaConfig(
        vocab_size=LLAMA3_VOCAB_ROWS,
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=num_hidden_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=hidden_size // 4,
        max_position_embeddings=131_072,
        rope_parameters={"rope_type": "default", "rope_theta": 500_000.0},
        tie_word_embeddings=True,
        bos_token_id=LLAMA3_BPE_IDS,
        eos_token_id=_LLAMA_GENERATION_EOS[release],
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    model.generation_config = GenerationConfig(
        bos_token_id=LLAMA3_BPE_IDS, eos_token_id=_LLAMA_GENERATION_EOS[release]
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
