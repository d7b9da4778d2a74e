"""Fixtures: the vendors' chat templates (fetched once per machine by scripts/fetch-chat-templates.py), and a
tokenizer to render them; the test kit (`train_testkit.py`) on sys.path."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # --import-mode=importlib adds no test directory

SPECIAL_TOKENS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|begin_of_text|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eot_id|>",
    "<|eom_id|>",
    "<|python_tag|>",
]

TemplateTokenizer = Callable[[str, str, str], Any]
"""``(template text, end-of-turn token, training text) -> tokenizer``."""


@pytest.fixture(scope="session")
def template_tokenizer() -> TemplateTokenizer:
    """A byte-level BPE trained in memory on a sample text, with every family's special tokens.

    Rendering is what the template tests are about: the vendor's template is rendered by transformers'
    ``apply_chat_template`` on this tokenizer (the real vocabularies are not needed for that).
    """
    pytest.importorskip("transformers")
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    def make(template: str, eos: str, sample: str) -> Any:
        base = Tokenizer(models.BPE())
        base.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        base.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=400,
            special_tokens=SPECIAL_TOKENS,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        )
        base.train_from_iterator([sample] * 10, trainer)
        tok = PreTrainedTokenizerFast(
            tokenizer_object=base,
            bos_token="<|begin_of_text|>",
            eos_token=eos,
            pad_token="<|endoftext|>",
            additional_special_tokens=[t for t in SPECIAL_TOKENS if t not in ("<|begin_of_text|>", eos)],
        )
        tok.chat_template = template
        return tok

    return make
