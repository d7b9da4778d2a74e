"""The sizes of a decoder-only language model that determine its training memory (`ModelShape`).

Parameter counts follow the Qwen2/Qwen3/Llama decoder layer: q/k/v/o projections (q/k/v biases where the
family has them), a SwiGLU MLP (gate/up/down), two RMSNorms per layer, Qwen3's per-head q/k norms, one final
norm, the embedding and an output head that is the embedding itself when the embeddings are tied. A Qwen3.5
hybrid mixes those full-attention layers (with an output gate: q_proj is twice as wide) with Gated DeltaNet
linear-attention layers (Yang et al. 2025, "Gated Delta Networks", ICLR; transformers' ``Qwen3_5GatedDeltaNet``):
`GatedDeltaNetShape`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal, assert_never, get_args

import attrs

from mcprl_train.errors import PlanError

if TYPE_CHECKING:
    from transformers import PretrainedConfig

__all__ = ["DEFAULT_LORA_TARGETS", "GATED_DELTA_NET_TARGETS", "GatedDeltaNetShape", "LayerType", "ModelShape"]

LayerType = Literal["full_attention", "sliding_attention", "linear_attention"]
DEFAULT_LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
GATED_DELTA_NET_TARGETS = ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a", "out_proj")
_LAYER_TYPES: tuple[str, ...] = get_args(LayerType)
RECURRENT_STATE_BYTES = 4
"""The delta rule's recurrent state is fp32 whatever the weights' dtype (transformers' torch and fla kernels)."""


@attrs.frozen(kw_only=True)
class GatedDeltaNetShape:
    """The sizes of one Gated DeltaNet linear-attention layer (transformers' ``Qwen3_5GatedDeltaNet``).

    Its parameters: ``in_proj_qkv`` (h → 2·key_dim + value_dim), ``in_proj_z`` (h → value_dim), ``in_proj_b``
    and ``in_proj_a`` (h → H_v), ``out_proj`` (value_dim → h), a depthwise causal ``conv1d`` over the q/k/v
    channels (``conv_dim · kernel``, no bias), ``dt_bias`` and ``A_log`` (H_v each) and the gated norm
    (``value_head_dim``). Per sequence it keeps a fixed-size state however long the sequence: the conv's last
    ``kernel`` inputs (``conv_dim · kernel`` at the weights' dtype) and the recurrent state ``S`` of Yang et al.
    2025 eq. (10), one ``d_k × d_v`` matrix per value head in fp32.
    """

    num_key_heads: int = attrs.field(validator=attrs.validators.gt(0))
    num_value_heads: int = attrs.field(validator=attrs.validators.gt(0))
    key_head_dim: int = attrs.field(validator=attrs.validators.gt(0))
    value_head_dim: int = attrs.field(validator=attrs.validators.gt(0))
    conv_kernel: int = attrs.field(validator=attrs.validators.gt(0))

    @property
    def key_dim(self) -> int:
        return self.num_key_heads * self.key_head_dim

    @property
    def value_dim(self) -> int:
        return self.num_value_heads * self.value_head_dim

    @property
    def conv_dim(self) -> int:
        return 2 * self.key_dim + self.value_dim

    def linear_shapes(self, hidden_size: int) -> dict[str, tuple[int, int]]:
        """``module name → (in_features, out_features)`` of the token mixer's linear layers."""
        h, v = hidden_size, self.value_dim
        return {
            "in_proj_qkv": (h, self.conv_dim),
            "in_proj_z": (h, v),
            "in_proj_b": (h, self.num_value_heads),
            "in_proj_a": (h, self.num_value_heads),
            "out_proj": (v, h),
        }

    @property
    def other_params(self) -> int:
        """The conv's weights, ``dt_bias``, ``A_log`` and the gated norm's weight."""
        return self.conv_dim * self.conv_kernel + 2 * self.num_value_heads + self.value_head_dim

    def state_bytes(self, w: int) -> int:
        """Bytes of one sequence's conv + recurrent state in one layer (``w``: the conv state's dtype)."""
        conv = self.conv_dim * self.conv_kernel * w
        return conv + self.num_value_heads * self.key_head_dim * self.value_head_dim * RECURRENT_STATE_BYTES


def _all_full(shape: ModelShape) -> tuple[LayerType, ...]:
    return ("full_attention",) * shape.num_layers


def _check_layer_types(
    shape: ModelShape, _attribute: attrs.Attribute[tuple[LayerType, ...]], value: tuple[LayerType, ...]
) -> None:
    if len(value) != shape.num_layers:
        raise PlanError(f"layer_types has {len(value)} entries for {shape.num_layers} layers")
    if "sliding_attention" in value and not shape.sliding_window:
        raise PlanError("sliding_attention layers need a sliding_window")
    if "linear_attention" in value and shape.gated_delta_net is None:
        raise PlanError("linear_attention layers need their gated_delta_net sizes")


@attrs.frozen(kw_only=True)
class ModelShape:
    """The sizes of a decoder-only (Qwen/Llama-style) model that determine its memory.

    Attributes:
        layer_types: One entry per layer; a ``sliding_attention`` layer's KV cache holds at most
            ``sliding_window`` tokens, a ``linear_attention`` layer (``gated_delta_net``) a fixed-size state.
        attention_output_gate: Qwen3.5's full attention: ``q_proj`` also projects a sigmoid gate on the output.
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
    gated_delta_net: GatedDeltaNetShape | None = None
    attention_output_gate: bool = False
    source: str = ""

    @property
    def q_dim(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.num_kv_heads * self.head_dim

    def linear_shapes(self, layer_type: LayerType = "full_attention") -> dict[str, tuple[int, int]]:
        """``module name → (in_features, out_features)`` of one ``layer_type`` decoder layer's linear layers."""
        h, i = self.hidden_size, self.intermediate_size
        mlp = {"gate_proj": (h, i), "up_proj": (h, i), "down_proj": (i, h)}
        match layer_type:
            case "full_attention" | "sliding_attention":
                gate = 2 if self.attention_output_gate else 1
                attention = {
                    "q_proj": (h, gate * self.q_dim),
                    "k_proj": (h, self.kv_dim),
                    "v_proj": (h, self.kv_dim),
                    "o_proj": (self.q_dim, h),
                }
                return attention | mlp
            case "linear_attention":
                return self._gated_delta_net().linear_shapes(h) | mlp
            case _ as unreachable:
                assert_never(unreachable)

    def _gated_delta_net(self) -> GatedDeltaNetShape:
        if self.gated_delta_net is None:
            raise PlanError("this model has no linear-attention layers")
        return self.gated_delta_net

    def linear_params_of(self, layer_type: LayerType) -> int:
        """Weights (and biases) of one ``layer_type`` layer's linear layers."""
        weights = sum(a * b for a, b in self.linear_shapes(layer_type).values())
        if layer_type == "linear_attention" or not self.attention_bias:
            return weights
        return weights + self.q_dim + 2 * self.kv_dim

    def params_of(self, layer_type: LayerType) -> int:
        """All parameters of one ``layer_type`` layer: its linear layers, norms and the mixer's other weights."""
        norms = 2 * self.hidden_size
        if layer_type == "linear_attention":
            return self.linear_params_of(layer_type) + norms + self._gated_delta_net().other_params
        return self.linear_params_of(layer_type) + norms + (2 * self.head_dim if self.qk_norm else 0)

    @property
    def layer_linear_params(self) -> int:
        """A full-attention layer's linear parameters (`linear_params_of`)."""
        return self.linear_params_of("full_attention")

    @property
    def layer_params(self) -> int:
        """The largest layer's parameters (what ZeRO-3 gathers at once)."""
        return max(self.params_of(t) for t in set(self.layer_types))

    @property
    def decoder_linear_params(self) -> int:
        """``Σ_layers P_lin``: every decoder layer's linear parameters."""
        return sum(self.linear_params_of(t) for t in self.layer_types)

    @property
    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size

    @property
    def num_params(self) -> int:
        head = 0 if self.tie_embeddings else self.embedding_params
        layers = sum(self.params_of(t) for t in self.layer_types)
        return self.embedding_params + layers + self.hidden_size + head

    def kv_tokens(self, seq_len: int) -> int:
        """Token slots one sequence of ``seq_len`` tokens keeps in the KV cache, summed over the layers (a
        linear-attention layer keeps none: its state has a fixed size, `state_bytes`)."""
        window = self.sliding_window or seq_len
        slots = {"full_attention": seq_len, "sliding_attention": min(seq_len, window), "linear_attention": 0}
        return sum(slots[t] for t in self.layer_types)

    def state_bytes(self, w: int) -> int:
        """Bytes of one sequence's fixed-size conv + recurrent state, summed over the linear-attention layers."""
        linear = self.layer_types.count("linear_attention")
        return linear * self._gated_delta_net().state_bytes(w) if linear else 0

    def lora_params(self, r: int, targets: tuple[str, ...] = ()) -> int:
        """Adapter parameters: ``r · (in + out)`` per targeted module of each layer that has it."""
        chosen = self.lora_targets(targets)
        return sum(
            r * sum(io for name, shape in self.linear_shapes(t).items() if name in chosen for io in shape)
            for t in self.layer_types
        )

    def lora_inputs(self, targets: tuple[str, ...] = (), layer_type: LayerType = "full_attention") -> int:
        """Σ of the targeted modules' input widths in one layer (what LoRA's forward saves per token)."""
        shapes = self.linear_shapes(layer_type)
        return sum(shapes[t][0] for t in self.lora_targets(targets) if t in shapes)

    def lora_targets(self, targets: tuple[str, ...] = ()) -> tuple[str, ...]:
        """``targets``, or every linear layer when empty (as `mcprl_policy.lora` adapts them); an unknown name
        is a `PlanError`."""
        hybrid = "linear_attention" in self.layer_types
        chosen = targets or (DEFAULT_LORA_TARGETS + (GATED_DELTA_NET_TARGETS if hybrid else ()))
        known = {name for t in set(self.layer_types) for name in self.linear_shapes(t)}
        unknown = [t for t in chosen if t not in known]
        if unknown:
            raise PlanError(
                f"lora.target_modules {unknown} are not linear layers of this model ({sorted(known)})"
            )
        return chosen

    @classmethod
    def from_hf_config(cls, cfg: PretrainedConfig, *, source: str = "") -> ModelShape:
        """From a transformers ``PretrainedConfig`` (Qwen2/3, Llama, Mistral field names).

        Raises:
            PlanError: a mixture-of-experts model, or layers other than full, sliding-window and Gated
                DeltaNet attention, which this shape does not describe.
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
                f"{model_type} has {odd} layers: plan's memory model covers full, sliding-window and Gated "
                "DeltaNet linear attention only"
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
            qk_norm=model_type in ("qwen3", *_QWEN3_5),
            max_position_embeddings=getattr(cfg, "max_position_embeddings", None),
            layer_types=layer_types,  # pyright: ignore[reportArgumentType]  # checked against LayerType above
            sliding_window=int(window) if window and "sliding_attention" in layer_types else None,
            gated_delta_net=_gated_delta_net(cfg) if "linear_attention" in layer_types else None,
            attention_output_gate=model_type in _QWEN3_5,
            source=source,
        )


_QWEN3_5 = ("qwen3_5", "qwen3_5_text")


def _gated_delta_net(cfg: PretrainedConfig) -> GatedDeltaNetShape:
    """From ``Qwen3_5TextConfig``'s ``linear_*`` fields."""
    return GatedDeltaNetShape(
        num_key_heads=int(cfg.linear_num_key_heads),
        num_value_heads=int(cfg.linear_num_value_heads),
        key_head_dim=int(cfg.linear_key_head_dim),
        value_head_dim=int(cfg.linear_value_head_dim),
        conv_kernel=int(cfg.linear_conv_kernel_dim),
    )
