"""The embedded tiny model: a seeded Qwen3 causal LM and a locally trained byte-level BPE tokenizer.

Built on first use into a cache directory keyed by a hash of everything that determines its bytes (preset,
corpus, seed, builder version), so the same inputs always give the same files and a second call is a
directory lookup. No network is touched.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Final

import attrs
import structlog
import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

from mcprl_policy.chat_template import CHAT_TEMPLATE
from mcprl_policy.corpus import embedded_corpus
from mcprl_policy.errors import ModelLoadError

__all__ = [
    "SPECIAL_TOKENS",
    "TINY_PRESETS",
    "TinyPreset",
    "build_tiny_model",
    "is_tiny_name",
    "mcprl_cache_dir",
]

_log = structlog.get_logger()

# Bump when the builder changes in a way that changes the produced bytes.
_BUILDER_VERSION: Final = 2

# Control tokens: skipped when decoding with skip_special_tokens=True.
_CONTROL_TOKENS: Final = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
# Markup tokens: single ids, but kept in decoded text so the environment can parse tool calls and answers.
_MARKUP_TOKENS: Final = (
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
    "<think>",
    "</think>",
    "<answer>",
    "</answer>",
)
SPECIAL_TOKENS: Final[tuple[str, ...]] = _CONTROL_TOKENS + _MARKUP_TOKENS


@attrs.frozen(kw_only=True)
class TinyPreset:
    """Size of an embedded tiny Qwen3 model (defaults: ``tiny``, ≈0.66 M parameters)."""

    hidden_size: int = attrs.field(default=128, validator=attrs.validators.gt(0))
    num_hidden_layers: int = attrs.field(default=2, validator=attrs.validators.gt(0))
    num_attention_heads: int = attrs.field(default=4, validator=attrs.validators.gt(0))
    num_key_value_heads: int = attrs.field(default=2, validator=attrs.validators.gt(0))
    intermediate_size: int = attrs.field(default=512, validator=attrs.validators.gt(0))
    vocab_size: int = attrs.field(default=2048, validator=attrs.validators.ge(512))
    max_position_embeddings: int = attrs.field(default=8192, validator=attrs.validators.gt(0))
    seed: int = 0

    def __attrs_post_init__(self) -> None:
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"num_attention_heads={self.num_attention_heads} is not a multiple of {self.num_key_value_heads}"
            )
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(f"hidden_size={self.hidden_size} is not a multiple of the head count")


TINY_PRESETS: Final[dict[str, TinyPreset]] = {
    "tiny": TinyPreset(),
    "tiny-4m": TinyPreset(hidden_size=256, num_hidden_layers=4, intermediate_size=1024),
    # The demo's model: `tiny` with 8 heads of 16 dims (and 8 KV heads) instead of 4 of 32 (2 KV heads). Same
    # width and depth, ~15-25 % more time per step on CPU; copying a ticker letter by letter out of the prompt
    # is mostly an attention job, and more, smaller heads do it far better (benchmarks/RESULTS.md, "## demo
    # ablations and limits").
    "tiny-8h": TinyPreset(num_attention_heads=8, num_key_value_heads=8),
}


def is_tiny_name(name: str) -> bool:
    """Whether ``name`` names an embedded preset (rather than a local directory or a hub id)."""
    return name in TINY_PRESETS


def mcprl_cache_dir() -> Path:
    """Root of mcprl's caches: ``$MCPRL_CACHE`` or ``~/.cache/mcprl``."""
    env = os.environ.get("MCPRL_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "mcprl"


def build_tiny_model(
    name: str = "tiny",
    *,
    extra_corpus: Sequence[str] = (),
    cache_dir: Path | None = None,
) -> Path:
    """Return the directory of the embedded model ``name``, building it on first use.

    Args:
        name: a key of ``TINY_PRESETS``.
        extra_corpus: more documents for the tokenizer (e.g. the task prompts); changes the hash.
        cache_dir: root of the model cache (default ``mcprl_cache_dir() / "models"``).

    Returns:
        A directory loadable with ``AutoModelForCausalLM.from_pretrained`` / ``AutoTokenizer.from_pretrained``
        (and by vLLM).
    """
    if name not in TINY_PRESETS:
        raise ModelLoadError(f"unknown embedded model {name!r}; known: {sorted(TINY_PRESETS)}")
    preset = TINY_PRESETS[name]
    corpus = [*embedded_corpus(), *extra_corpus]
    digest = _digest(preset, corpus)
    root = cache_dir if cache_dir is not None else mcprl_cache_dir() / "models"
    target = root / f"{name}-{digest}"
    if (target / "model.safetensors").is_file() and (target / "tokenizer.json").is_file():
        return target
    root.mkdir(parents=True, exist_ok=True)
    # Build in a sibling temp dir and rename: a concurrent or interrupted build never leaves a half directory.
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=root))
    try:
        tokenizer = build_tiny_tokenizer(corpus, vocab_size=preset.vocab_size)
        model = _build_model(preset, tokenizer)
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        if not (tmp / "model.safetensors").is_file():
            # transformers writes weights only on rank 0 once torch.distributed is initialised.
            raise ModelLoadError(
                f"building embedded model {name!r}: save_pretrained wrote no weights in this process "
                "(a non-zero torch.distributed rank?); build it on rank 0 first, then barrier"
            )
        try:
            tmp.rename(target)
        except OSError:
            if not (target / "model.safetensors").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    _log.info("tiny_model_built", name=name, path=str(target), vocab=len(tokenizer))
    return target


def build_tiny_tokenizer(corpus: Sequence[str], *, vocab_size: int = 2048) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE tokenizer on ``corpus`` (digits split one per token) with the chat template."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.Split(Regex("[A-Z]"), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=1,
        show_progress=False,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(corpus, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=list(_CONTROL_TOKENS[1:]),
        clean_up_tokenization_spaces=False,
        model_max_length=TINY_PRESETS["tiny"].max_position_embeddings,
    )
    # Markup tokens are single ids but not "special": decode(skip_special_tokens=True) keeps them.
    fast.add_tokens(list(_MARKUP_TOKENS))
    fast.chat_template = CHAT_TEMPLATE
    return fast


def _build_model(preset: TinyPreset, tokenizer: PreTrainedTokenizerFast) -> Qwen3ForCausalLM:
    config = Qwen3Config(
        vocab_size=len(tokenizer),
        hidden_size=preset.hidden_size,
        intermediate_size=preset.intermediate_size,
        num_hidden_layers=preset.num_hidden_layers,
        num_attention_heads=preset.num_attention_heads,
        num_key_value_heads=preset.num_key_value_heads,
        head_dim=preset.hidden_size // preset.num_attention_heads,
        max_position_embeddings=preset.max_position_embeddings,
        tie_word_embeddings=True,
        eos_token_id=_token_id(tokenizer, "<|im_end|>"),
        pad_token_id=_token_id(tokenizer, "<|endoftext|>"),
        bos_token_id=None,
        dtype="float32",
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(preset.seed)
        model = Qwen3ForCausalLM(config)
    model.generation_config.eos_token_id = config.eos_token_id
    model.generation_config.pad_token_id = config.pad_token_id
    return model.eval()


def _token_id(tokenizer: PreTrainedTokenizerFast, token: str) -> int:
    token_id = tokenizer.convert_tokens_to_ids(token)
    if not isinstance(token_id, int):
        raise ModelLoadError(f"token {token!r} is missing from the tiny tokenizer")
    return token_id


def _digest(preset: TinyPreset, corpus: Sequence[str]) -> str:
    payload = json.dumps(
        {
            "builder": _BUILDER_VERSION,
            "preset": attrs.asdict(preset),
            "corpus": list(corpus),
            "template": CHAT_TEMPLATE,
            "special_tokens": SPECIAL_TOKENS,
        },
        sort_keys=True,
    )
    return hashlib.sha256(payload.encode()).hexdigest()[:12]
