"""The policy: a causal LM (optionally LoRA / 4-bit) with a value head, its tokenizer, save and load."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, Final

import attrs
import structlog
import torch
from torch import nn

from mcprl_policy.config import AttnImplementation, DType, LoraSettings, Precision, Quantization
from mcprl_policy.errors import ModelLoadError, PolicyError
from mcprl_policy.loading import load_model, load_tokenizer, resolve_model_path
from mcprl_policy.lora import apply_lora
from mcprl_policy.packed import PackedForward, packed_forward
from mcprl_policy.pinned_models import is_pinned_name
from mcprl_policy.precision import autocast, cast_trainable, check_device
from mcprl_policy.value_head import VALUE_HEAD_FILE, ValueHead
from mcprl_policy.vocab import vocab_limit

__all__ = ["POLICY_META_FILE", "Policy"]

_log = structlog.get_logger()

POLICY_META_FILE: Final = "mcprl_policy.json"


class Policy:
    """A causal language model with an optional value head, as trained by mcprl.

    Build with `Policy.from_pretrained`. Attributes: ``model`` (a transformers model, or a peft model when
    LoRA is on), ``tokenizer``, ``value_head`` (`ValueHead` or ``None``), ``lora`` (`LoraSettings` or
    ``None``), ``quantization``, ``base_model`` (the directory or hub id the base weights came from, or
    the built-in pretrained model's name: `mcprl_policy.pinned_models`),
    ``precision`` (`Precision`: the forwards run under `autocast`), `logits_chunk_size` and `vocab_limit`.

    Raises:
        ModelLoadError: the tokenizer has ids that the model's embedding cannot hold.
    """

    def __init__(
        self,
        *,
        model: nn.Module,
        tokenizer: Any,
        value_head: ValueHead | None,
        base_model: str,
        lora: LoraSettings | None = None,
        quantization: Quantization | None = None,
        precision: Precision | None = None,
        logits_chunk_size: int = 1024,
    ) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.value_head = value_head
        self.base_model = base_model
        self.lora = lora
        self.quantization = quantization
        self.precision = precision if precision is not None else Precision()
        self.logits_chunk_size = logits_chunk_size  # validated by the property's setter
        self._vocab_limit = vocab_limit(tokenizer, model)
        if value_head is not None:
            value_head.to(self.device)

    @classmethod
    def from_pretrained(
        cls,
        name_or_path: str | Path = "tiny",
        *,
        value_head: bool = True,
        lora: LoraSettings | None = None,
        quantization: Quantization | None = None,
        dtype: DType = "float32",
        master_weights: bool = True,
        device: str = "cpu",
        extra_corpus: Sequence[str] = (),
        gradient_checkpointing: bool = False,
        revision: str | None = None,
        attn_implementation: AttnImplementation = "auto",
    ) -> Policy:
        """Load a policy.

        Args:
            name_or_path: an embedded preset (``"tiny"``, ``"tiny-4m"``), a directory (a plain model, or a
                directory written by `save_pretrained`, adapter or full) or a hub id.
            value_head: attach a value head (loaded from the directory when saved there).
            lora: wrap in LoRA adapters; ignored for a saved adapter directory (its own settings are used).
            quantization: load linear weights in 4 bits (needs LoRA and the ``qlora`` extra).
            dtype: the compute dtype, and the dtype of frozen weights (`Precision.dtype`).
            master_weights: keep trainable parameters in float32 under a low-precision ``dtype``
                (``bf16-mixed``; False: ``bf16-true``). A full fine-tune then loads every weight in float32.
            device: torch device string.
            extra_corpus: more tokenizer training text for the embedded presets.
            gradient_checkpointing: recompute activations in backward.
            revision: hub revision.
            attn_implementation: attention kernels (`mcprl_policy.attention.resolve_attn_implementation`).
        """
        if quantization is not None and lora is None and not _is_saved_adapter(name_or_path):
            raise PolicyError("4-bit base weights cannot be fully fine-tuned: pass lora=LoraSettings(...)")
        precision = Precision(dtype=dtype, master_weights=master_weights)
        check_device(precision, device)
        meta = _read_meta(name_or_path)
        if meta is not None and meta.get("lora") is not None:
            policy = cls._load_saved_adapter(
                Path(name_or_path),
                meta,
                value_head=value_head,
                precision=precision,
                device=device,
                revision=revision,
                attn_implementation=attn_implementation,
            )
        else:
            path = resolve_model_path(name_or_path, extra_corpus=extra_corpus)
            # Every weight of a full fine-tune trains: it loads in the trainables' dtype.
            load_dtype = precision.param_dtype if lora is None else precision.dtype
            model = load_model(
                path,
                dtype=load_dtype,
                device=device,
                quantization=quantization,
                revision=revision,
                attn_implementation=attn_implementation,
            )
            if lora is not None:
                model = apply_lora(model, lora)
            cast_trainable(model, precision)
            head = _load_or_new_value_head(Path(path), model) if value_head else None
            policy = cls(
                model=model,
                tokenizer=load_tokenizer(path, revision=revision),
                value_head=head,
                # A built-in model's name resolves on any machine; its cache directory is this machine's.
                base_model=str(name_or_path) if is_pinned_name(str(name_or_path)) else path,
                lora=lora,
                quantization=quantization,
                precision=precision,
            )
        policy.set_gradient_checkpointing(gradient_checkpointing)
        _log.info(
            "policy_loaded",
            model=str(name_or_path),
            lora=policy.lora is not None,
            quantization=policy.quantization,
            precision=policy.precision.name,
            trainable_params=sum(p.numel() for p in policy.trainable_parameters()),
        )
        return policy

    @classmethod
    def _load_saved_adapter(
        cls,
        path: Path,
        meta: dict[str, Any],
        *,
        value_head: bool,
        precision: Precision,
        device: str,
        revision: str | None,
        attn_implementation: AttnImplementation,
    ) -> Policy:
        from peft import PeftModel

        settings = LoraSettings(**meta["lora"])
        quantization = meta.get("quantization")
        base = load_model(
            resolve_model_path(meta["base_model"]),
            dtype=precision.dtype,
            device=device,
            quantization=quantization,
            attn_implementation=attn_implementation,
        )
        model = PeftModel.from_pretrained(base, str(path), is_trainable=True)
        cast_trainable(model, precision)
        head = _load_or_new_value_head(path, model) if value_head else None
        return cls(
            model=model,
            tokenizer=load_tokenizer(str(path), revision=revision),
            value_head=head,
            base_model=meta["base_model"],
            lora=settings,
            quantization=quantization,
            precision=precision,
        )

    @property
    def logits_chunk_size(self) -> int:
        """Token rows per output-head chunk in the training forwards (`forward_packed`, `policy_forward`).

        The forward materialises ``logits_chunk_size × vocabulary`` logits at a time (recomputed in backward),
        which bounds its memory; results do not depend on it. Settable; must be >= 1.
        """
        return self._logits_chunk_size

    @logits_chunk_size.setter
    def logits_chunk_size(self, value: int) -> None:
        if value < 1:
            raise ValueError(f"logits_chunk_size must be >= 1, got {value}")
        self._logits_chunk_size = int(value)

    @property
    def vocab_limit(self) -> int:
        """Ids the policy emits: ``[0, vocab_limit)``, those the tokenizer decodes (`mcprl_policy.vocab`).

        At most the embedding's rows (Qwen3: 151,669 of 151,936). Samplers never emit an id at or above it,
        and the training forwards (`forward_packed`, `policy_forward`, `ReferencePolicy.logprobs`) normalise
        logprobs and entropies over the same ids, so a sampled token's logprob equals its recomputation.
        """
        return self._vocab_limit

    @property
    def device(self) -> torch.device:
        """Device of the model's first parameter."""
        return next(self.model.parameters()).device

    @property
    def hidden_size(self) -> int:
        """Width of the backbone's hidden state."""
        return _hidden_size(self.model)

    def autocast(self) -> AbstractContextManager[object]:
        """The context every forward of this policy runs in: autocast under ``bf16-mixed``, else a no-op."""
        return autocast(self.precision, self.device)

    def trainable_parameters(self) -> list[nn.Parameter]:
        """Parameters that receive gradients: adapters (LoRA) or all weights (full), plus the value head."""
        return [p for _, p in self.named_trainable_parameters()]

    def named_trainable_parameters(self) -> Iterator[tuple[str, nn.Parameter]]:
        """`trainable_parameters` with names (value head entries are prefixed ``value_head.``)."""
        for name, p in self.model.named_parameters():
            if p.requires_grad:
                yield name, p
        if self.value_head is not None:
            for name, p in self.value_head.named_parameters():
                if p.requires_grad:
                    yield f"value_head.{name}", p

    def set_gradient_checkpointing(self, enabled: bool) -> None:
        """Switch activation recomputation in backward on or off."""
        model: Any = self.model
        if enabled:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        elif getattr(model, "is_gradient_checkpointing", False):
            model.gradient_checkpointing_disable()

    def train(self, mode: bool = True) -> Policy:
        """Put model and value head in training (or eval) mode."""
        self.model.train(mode)
        if self.value_head is not None:
            self.value_head.train(mode)
        return self

    def eval(self) -> Policy:
        """Put model and value head in eval mode."""
        return self.train(False)

    def forward_packed(
        self,
        sequences: Sequence[Sequence[int]],
        temperature: float = 1.0,
        *,
        values: bool = True,
        needed: torch.Tensor | None = None,
    ) -> PackedForward:
        """Per-token logprobs, entropies and values of packed unpadded ``sequences`` (see `PackedForward`).

        Uses the live weights; runs under autograd unless called inside ``torch.no_grad()``. ``temperature``
        must equal the sampler's so that ratios against its logprobs start at 1. ``needed`` (``(N,)`` bool)
        scores only those tokens (`mcprl_policy.packed.scored_tokens`).
        """
        with self.autocast():
            return packed_forward(
                self.model,
                sequences,
                temperature=temperature,
                value_head=self.value_head if values else None,
                chunk_size=self.logits_chunk_size,
                vocab_limit=self.vocab_limit,
                needed=needed,
            )

    def save_pretrained(self, directory: str | Path) -> Path:
        """Write the policy: adapter (LoRA) or full weights, tokenizer, value head and ``mcprl_policy.json``."""
        out = Path(directory)
        out.mkdir(parents=True, exist_ok=True)
        model: Any = self.model
        model.save_pretrained(str(out), safe_serialization=True)
        self.tokenizer.save_pretrained(str(out))
        if self.value_head is not None:
            self.value_head.save(out)
        meta = {
            "format": 1,
            "base_model": self.base_model,
            "lora": attrs.asdict(self.lora) if self.lora is not None else None,
            "quantization": self.quantization,
            "value_head": self.value_head is not None,
        }
        (out / POLICY_META_FILE).write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
        return out


def _read_meta(name_or_path: str | Path) -> dict[str, Any] | None:
    path = Path(name_or_path) / POLICY_META_FILE
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ModelLoadError(f"{path} is not valid JSON: {exc}") from exc


def _is_saved_adapter(name_or_path: str | Path) -> bool:
    meta = _read_meta(name_or_path)
    return meta is not None and meta.get("lora") is not None


def _hidden_size(model: nn.Module) -> int:
    config = getattr(model, "config", None)
    text_config = getattr(config, "get_text_config", None)
    if callable(text_config):
        config = text_config()
    size = getattr(config, "hidden_size", None)
    if not isinstance(size, int):
        raise PolicyError(f"cannot find the hidden size of {type(model).__name__}")
    return size


def _load_or_new_value_head(directory: Path, model: nn.Module) -> ValueHead:
    hidden = _hidden_size(model)
    if (directory / VALUE_HEAD_FILE).is_file():
        return ValueHead.load(directory, hidden_size=hidden)
    return ValueHead(hidden)
