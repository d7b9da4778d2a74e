"""Token-id bounds of a model and its tokenizer.

Two bounds differ for most published checkpoints: the rows of the embedding (what the model can read and its
head scores; Qwen3: 151,936, padded to a multiple of 128) and the ids the tokenizer can decode (Qwen3:
151,669). Ids in between are legal model inputs but no text: transformers decodes them to ``""`` and serving
stacks have refused them as the next turn's prompt. The policy's distribution is therefore the softmax over
the decodable ids only, in the samplers and in the training forward alike, so that such ids are never
sampled and the learner's ratios still start at exactly 1.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from mcprl_policy.errors import ModelLoadError

__all__ = ["decodable_ids", "embedding_rows", "end_of_turn_ids", "vocab_limit"]


def embedding_rows(model: nn.Module) -> int:
    """Rows of ``model``'s input embedding: every valid input id is below it."""
    embeddings: Any = model.get_input_embeddings()  # pyright: ignore[reportCallIssue]
    return int(embeddings.num_embeddings)


def _output_rows(model: nn.Module) -> int:
    get_output: Any = getattr(model, "get_output_embeddings", None)
    head: Any = get_output() if callable(get_output) else None
    weight: Any = getattr(head, "weight", None)
    return int(weight.shape[0]) if weight is not None else embedding_rows(model)


def decodable_ids(tokenizer: Any) -> int:
    """One past the largest id ``tokenizer`` knows (``len(tokenizer)`` unless its ids have gaps)."""
    vocab: dict[str, int] = tokenizer.get_vocab()
    return max(len(tokenizer), max(vocab.values(), default=-1) + 1)


def vocab_limit(tokenizer: Any, model: nn.Module) -> int:
    """The ids a policy may emit: ``[0, limit)``, those the tokenizer decodes.

    Raises:
        ModelLoadError: the tokenizer has ids the model cannot embed or score (tokenizer and model from
            different checkpoints).
    """
    limit = decodable_ids(tokenizer)
    rows = min(embedding_rows(model), _output_rows(model))
    if limit > rows:
        raise ModelLoadError(
            f"the tokenizer has {limit} ids but the model's embedding has {rows} rows: tokenizer and model "
            "come from different checkpoints (or the embedding was not resized after adding tokens)"
        )
    return limit


def end_of_turn_ids(tokenizer: Any, model: Any) -> frozenset[int]:
    """The end-of-turn ids: the tokenizer's eos, ``<|im_end|>`` when present, the generation config's eos."""
    ids: set[int] = set()
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    if isinstance(im_end, int) and im_end != tokenizer.unk_token_id:
        ids.add(im_end)
    generation_config = getattr(model, "generation_config", None)
    eos = getattr(generation_config, "eos_token_id", None)
    if isinstance(eos, int):
        ids.add(eos)
    elif isinstance(eos, list | tuple):
        ids.update(int(e) for e in eos)
    if not ids:
        raise ValueError("the tokenizer has no end-of-turn token (eos_token_id is None and no <|im_end|>)")
    return frozenset(ids)
