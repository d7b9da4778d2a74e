"""Architecture numbers of common models, so `mcprl-train plan` answers without the hub.

Each row transcribes the model's published ``config.json`` (the URL is the row's ``source``): hidden size,
layers, attention and KV heads, head dimension, MLP width, vocabulary, tied embeddings, maximum position and
the layer types (all full attention for these models).

Qwen3.5 rows are the ``text_config`` of the published (vision-language) checkpoints: the language model
that GRPO trains; the vision tower and the multi-token-prediction layer are not loaded by
``Qwen3_5ForCausalLM`` and not counted. Three linear-attention (Gated DeltaNet) layers precede each full-attention
layer (``full_attention_interval`` 4), conv kernel 4, key/value head dims 128, vocabulary 248,320, head dim
256, 262,144 positions. The hub was not reachable here: each row's numbers were read from transcriptions of
its config.json in public code found with the search tool, two independent ones agreeing per size —
0.8B: a C++ test's "compact mirror of Qwen/Qwen3.5-0.8B's config.json" and a C++ config-parser test;
4B: a Python test's ``/root/models/Qwen3.5-4B`` text_config and a converter test's; 9B: transformers'
``Qwen3_5TextConfig`` defaults (documented as "the Qwen3.5-9B style configuration") and a Rust test's
qwen3_5 text_config; 27B: THUDM/slime's scripts/models/qwen3.5-27B.sh (untied embeddings) and three
converter tests' "official" text_config. Qwen3.5-2B is left out: no transcription of its full config was
found (only its hidden size, 2048).
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Final

from mcprl_train.commands.shape import GatedDeltaNetShape, ModelShape

__all__ = ["KNOWN_ARCHITECTURES"]


def _source(name: str) -> str:
    return f"https://huggingface.co/{name}/blob/main/config.json"


def _qwen3(
    name: str, hidden: int, layers: int, heads: int, intermediate: int, tied: bool
) -> tuple[str, ModelShape]:
    return name, ModelShape(
        vocab_size=151_936,
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=8,
        head_dim=128,
        tie_embeddings=tied,
        max_position_embeddings=40_960,
        source=_source(name),
    )


def _qwen2_5(
    name: str, hidden: int, layers: int, heads: int, kv_heads: int, intermediate: int, vocab: int, tied: bool
) -> tuple[str, ModelShape]:
    return name, ModelShape(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=hidden // heads,
        tie_embeddings=tied,
        attention_bias=True,
        qk_norm=False,
        max_position_embeddings=32_768,
        source=_source(name),
    )


def _llama3(
    name: str, hidden: int, layers: int, heads: int, head_dim: int, intermediate: int, tied: bool
) -> tuple[str, ModelShape]:
    return name, ModelShape(
        vocab_size=128_256,
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=8,
        head_dim=head_dim,
        tie_embeddings=tied,
        qk_norm=False,
        max_position_embeddings=131_072,
        source=_source(name),
    )


def _qwen3_5(
    name: str,
    hidden: int,
    layers: int,
    heads: int,
    kv_heads: int,
    intermediate: int,
    linear_key_heads: int,
    linear_value_heads: int,
    tied: bool,
) -> tuple[str, ModelShape]:
    return name, ModelShape(
        vocab_size=248_320,
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=256,
        tie_embeddings=tied,
        max_position_embeddings=262_144,
        layer_types=tuple(
            "full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(layers)
        ),
        gated_delta_net=GatedDeltaNetShape(
            num_key_heads=linear_key_heads,
            num_value_heads=linear_value_heads,
            key_head_dim=128,
            value_head_dim=128,
            conv_kernel=4,
        ),
        attention_output_gate=True,
        source=_source(name),
    )


_SMOLLM2_135M = (
    # Also the dequantised GGUF that the built-in model name ``smollm2-135m`` converts (its config.json agrees).
    "HuggingFaceTB/SmolLM2-135M-Instruct",
    ModelShape(
        vocab_size=49_152,
        hidden_size=576,
        intermediate_size=1536,
        num_layers=30,
        num_heads=9,
        num_kv_heads=3,
        head_dim=64,
        tie_embeddings=True,
        qk_norm=False,
        max_position_embeddings=8192,
        source=_source("HuggingFaceTB/SmolLM2-135M-Instruct"),
    ),
)

_ROWS: tuple[tuple[str, ModelShape], ...] = (  # each row is its family's builder's arguments
    _SMOLLM2_135M,
    *(
        _qwen3(*row)  # name, hidden, layers, heads, intermediate, tied
        for row in (
            ("Qwen/Qwen3-0.6B", 1024, 28, 16, 3072, True),
            ("Qwen/Qwen3-1.7B", 2048, 28, 16, 6144, True),
            ("Qwen/Qwen3-4B", 2560, 36, 32, 9728, True),
            ("Qwen/Qwen3-8B", 4096, 36, 32, 12288, False),
        )
    ),
    *(
        _qwen2_5(*row)  # name, hidden, layers, heads, kv_heads, intermediate, vocab, tied
        for row in (
            ("Qwen/Qwen2.5-0.5B-Instruct", 896, 24, 14, 2, 4864, 151_936, True),
            ("Qwen/Qwen2.5-1.5B-Instruct", 1536, 28, 12, 2, 8960, 151_936, True),
            ("Qwen/Qwen2.5-3B-Instruct", 2048, 36, 16, 2, 11008, 151_936, True),
            ("Qwen/Qwen2.5-7B-Instruct", 3584, 28, 28, 4, 18944, 152_064, False),
        )
    ),
    *(
        _llama3(*row)  # name, hidden, layers, heads, head_dim, intermediate, tied
        for row in (
            ("meta-llama/Llama-3.2-1B-Instruct", 2048, 16, 32, 64, 8192, True),
            ("meta-llama/Llama-3.2-3B-Instruct", 3072, 28, 24, 128, 8192, True),
            ("meta-llama/Llama-3.1-8B-Instruct", 4096, 32, 32, 128, 14336, False),
        )
    ),
    *(
        _qwen3_5(*row)  # name, hidden, layers, heads, kv_heads, intermediate, linear key/value heads, tied
        for row in (
            ("Qwen/Qwen3.5-0.8B", 1024, 24, 8, 2, 3584, 16, 16, True),
            ("Qwen/Qwen3.5-4B", 2560, 32, 16, 4, 9216, 16, 32, True),
            ("Qwen/Qwen3.5-9B", 4096, 32, 16, 4, 12288, 16, 32, False),
            ("Qwen/Qwen3.5-27B", 5120, 64, 24, 4, 17408, 16, 48, False),
        )
    ),
)

KNOWN_ARCHITECTURES: Final[Mapping[str, ModelShape]] = MappingProxyType(dict(_ROWS))
