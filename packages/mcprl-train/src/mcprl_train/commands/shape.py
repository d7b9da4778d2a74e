"""The sizes of a decoder-only language model that determine its training memory (`ModelShape`).

Parameter counts follow the Qwen2/Qwen3/Llama decoder layer: q/k/v/o projections (q/k/v biases where the
family has them), a SwiGLU MLP (gate/up/down), two RMSNorms per layer, Qwen3's per-head q/k norms, one final
norm, the embedding and an output head that is the embedding itself when the embeddings are tied.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal, get_args

import attrs

from mcprl_train.errors import PlanError

if TYPE_CHECKING:
    from transformers import PretrainedConfig

__all__ = ["DEFAULT_LORA_TARGETS", "LayerType", "ModelShape"]

LayerType = Literal["full_attention", "sliding_attention"]
DEFAULT_LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
_LAYER_TYPES: tuple[str, ...] = get_args(LayerType)


def _all_full(shape: ModelShape) -> tuple[LayerType, ...]:
    return ("full_attention",) * shape.num_layers


def _check_layer_types(
    shape: ModelShape, _attribute: attrs.Attribute[tuple[LayerType, ...]], value: tuple[LayerType, ...]
) -> None:
    if len(value) != shape.num_layers:
        raise PlanError(f"layer_types has {len(value)} entries for {shape.num_layers} layers")
    if "sliding_attention" in value and not shape.sliding_window:
        raise PlanError("sliding_attention layers need a sliding_window")


@attrs.frozen(kw_only=True)
class ModelShape:
    """The sizes of a decoder-only (Qwen/Llama-style) model that determine its memory.

    Attributes:
        layer_types: One entry per layer; a ``sliding_attention`` layer's KV cache holds at most
            ``sliding_window`` tokens.
        source: Where the numbers come from (the table's config.json URL, a directory, a cache path).
    """

    vocab_size: int = attrs.field(validator=attrs.validators.gt(0))
    hidden_size: int = attrs.field(validator=attrs.validators.gt(0))
    intermediate_size: int = attrs.field(validator=attrs.validators.gt(0))
    num_layers: int = attrs.field(validator=attrs.validators.gt(0))
    num_heads: int = attrs.field(validator=attrs.validators.gt(0))
    num_kv_heads: int = attrs.field(validator=attrs.validators.gt(0))
    head_dim: int = attrs.field(validator=attrs.validators.gt(0))
    tie_embeddings: bool = True
    attention_bias: bool = False
    qk_norm: bool = True
    max_position_embeddings: int | None = None
    layer_types: tuple[LayerType, ...] = attrs.field(
        default=attrs.Factory(_all_full, takes_self=True), validator=_check_layer_types
    )
    sliding_window: int | None = None
    source: str = ""

    @property
    def q_dim(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.num_kv_heads * self.head_dim

    def linear_shapes(self) -> dict[str, tuple[int, int]]:
        """``module name → (in_features, out_features)`` of one decoder layer's linear layers."""
        h, i = self.hidden_size, self.intermediate_size
        return {
            "q_proj": (h, self.q_dim),
            "k_proj": (h, self.kv_dim),
            "v_proj": (h, self.kv_dim),
            "o_proj": (self.q_dim, h),
            "gate_proj": (h, i),
            "up_proj": (h, i),
            "down_proj": (i, h),
        }

    @property
    def layer_linear_params(self) -> int:
        weights = sum(a * b for a, b in self.linear_shapes().values())
        bias = (self.q_dim + 2 * self.kv_dim) if self.attention_bias else 0
        return weights + bias

    @property
    def layer_params(self) -> int:
        norms = 2 * self.hidden_size + (2 * self.head_dim if self.qk_norm else 0)
        return self.layer_linear_params + norms

    @property
    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size

    @property
    def num_params(self) -> int:
        head = 0 if self.tie_embeddings else self.embedding_params
        return self.embedding_params + self.num_layers * self.layer_params + self.hidden_size + head

    def kv_tokens(self, seq_len: int) -> int:
        """Token slots one sequence of ``seq_len`` tokens keeps in the KV cache, summed over the layers."""
        window = self.sliding_window or seq_len
        return sum(seq_len if t == "full_attention" else min(seq_len, window) for t in self.layer_types)

    def lora_params(self, r: int, targets: tuple[str, ...] = ()) -> int:
        """Adapter parameters: ``r · (in + out)`` per targeted module per layer."""
        shapes = self.linear_shapes()
        return self.num_layers * sum(r * sum(shapes[t]) for t in self.lora_targets(targets))

    def lora_inputs(self, targets: tuple[str, ...] = ()) -> int:
        """Σ of the targeted modules' input widths in one layer (what LoRA's forward saves per token)."""
        shapes = self.linear_shapes()
        return sum(shapes[t][0] for t in self.lora_targets(targets))

    def lora_targets(self, targets: tuple[str, ...] = ()) -> tuple[str, ...]:
        """``targets``, or every linear layer when empty; an unknown name is a `PlanError`."""
        chosen = targets or DEFAULT_LORA_TARGETS
        unknown = [t for t in chosen if t not in self.linear_shapes()]
        if unknown:
            raise PlanError(
                f"lora.target_modules {unknown} are not linear layers of this model "
                f"({sorted(self.linear_shapes())})"
            )
        return chosen

    @classmethod
    def from_hf_config(cls, cfg: PretrainedConfig, *, source: str = "") -> ModelShape:
        """From a transformers ``PretrainedConfig`` (Qwen2/3, Llama, Mistral field names).

        Raises:
            PlanError: a mixture-of-experts or linear-attention model, whose layers this shape does not
                describe.
        """
        model_type = str(getattr(cfg, "model_type", ""))
        experts = getattr(cfg, "num_experts", None) or getattr(cfg, "num_local_experts", None)
        if experts:
            raise PlanError(
                f"{model_type} is a mixture-of-experts model ({experts} experts): plan's memory model covers "
                "dense decoders only"
            )
        layers = int(cfg.num_hidden_layers)
        raw_types = getattr(cfg, "layer_types", None) or ("full_attention",) * layers
        layer_types = tuple(str(t) for t in raw_types)
        odd = sorted(set(layer_types) - set(_LAYER_TYPES))
        if odd:
            raise PlanError(
                f"{model_type} has {odd} layers: plan's memory model covers full and sliding-window attention "
                "only (a hybrid's linear-attention layers have other parameters and a recurrent state)"
            )
        hidden = int(cfg.hidden_size)
        heads = int(cfg.num_attention_heads)
        head_dim = getattr(cfg, "head_dim", None) or hidden // heads
        window = getattr(cfg, "sliding_window", None)
        return cls(
            vocab_size=int(cfg.vocab_size),
            hidden_size=hidden,
            intermediate_size=int(cfg.intermediate_size),
            num_layers=layers,
            num_heads=heads,
            num_kv_heads=int(getattr(cfg, "num_key_value_heads", None) or heads),
            head_dim=int(head_dim),
            tie_embeddings=bool(getattr(cfg, "tie_word_embeddings", False)),
            # Qwen2's q/k/v projections always carry a bias (its config has no attention_bias field).
            attention_bias=model_type == "qwen2" or bool(getattr(cfg, "attention_bias", False)),
            qk_norm=model_type == "qwen3",
            max_position_embeddings=getattr(cfg, "max_position_embeddings", None),
            layer_types=layer_types,  # pyright: ignore[reportArgumentType]  # checked against LayerType above
            sliding_window=int(window) if window and "sliding_attention" in layer_types else None,
            source=source,
        )
